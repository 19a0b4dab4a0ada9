"""Migration 0021 (SPEC §16): API keys and subscriptions stored before it keep their
fields and land in their user's personal workspace, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from playhouse.migrations import Runner

from orchestra.db import migrate
from orchestra.db.access_models import ApiKey
from orchestra.db.database import connect
from orchestra.db.models import utcnow
from orchestra.db.trigger_models import EventSubscription
from orchestra.db.workspace_models import Workspace


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'blank.db'}"
    return request.getfixturevalue("blank_postgres_url")


async def test_keys_and_subscriptions_land_in_their_users_personal_workspace(database_url):
    db = connect(database_url)
    try:
        runner = Runner(db, directory=str(migrate.MIGRATIONS_DIR))
        await db.run(lambda: runner.up("0017_secret_hosts"))
        p = db.param
        for user_id, name in (("u-alice", "alice"), ("u-bob", "bob")):
            await db.aexecute_sql(
                f'INSERT INTO "user" (id, user_name, user_name_key, password_hash, role, created_at) '
                f"VALUES ({p}, {p}, {p}, 'x', 'USER', {p})", (user_id, name, name, utcnow()))
        await db.run(lambda: runner.up("0020_audit_log"))  # 0019 makes their personal workspaces
        for user_id in ("u-alice", "u-bob"):
            await db.aexecute_sql(
                f"INSERT INTO api_key (id, user_id, name, key_hash, prefix, scopes, created_at) "
                f"VALUES ({p}, {p}, 'ci', {p}, 'abcd', '[\"run:read\"]', {p})",
                (f"k-{user_id}", user_id, f"hash-{user_id}", utcnow()))
            await db.aexecute_sql(
                f"INSERT INTO event_subscription (id, owner_id, url, events, secret_encrypted, created_at) "
                f"VALUES ({p}, {p}, 'https://example.com/h', '[\"run.failed\"]', 'enc', {p})",
                (f"s-{user_id}", user_id, utcnow()))
        assert "0021_key_subscription_workspaces" in await migrate.upgrade(db)
        with db.bind_ctx([ApiKey, EventSubscription, Workspace]):
            personal = {w.personal_user_id: w.id for w in await db.list(Workspace.select())}
            assert set(personal) == {"u-alice", "u-bob"}
            keys = await db.list(ApiKey.select().order_by(ApiKey.id))
            assert [(k.id, k.user_id, k.workspace_id, k.scopes, k.key_hash) for k in keys] == [
                ("k-u-alice", "u-alice", personal["u-alice"], ["run:read"], "hash-u-alice"),
                ("k-u-bob", "u-bob", personal["u-bob"], ["run:read"], "hash-u-bob")]
            subs = await db.list(EventSubscription.select().order_by(EventSubscription.id))
            assert [(s.id, s.owner_id, s.workspace_id, s.events, s.url) for s in subs] == [
                ("s-u-alice", "u-alice", personal["u-alice"], ["run.failed"], "https://example.com/h"),
                ("s-u-bob", "u-bob", personal["u-bob"], ["run.failed"], "https://example.com/h")]
    finally:
        await db.close_pool()


async def test_keys_stored_without_a_workspace_land_in_their_users_personal_one(database_url):
    """Migration 0022: a key made after 0021 by a release that stored no workspace on keys
    is put in its user's personal workspace; one that names a workspace keeps it."""
    db = connect(database_url)
    try:
        runner = Runner(db, directory=str(migrate.MIGRATIONS_DIR))
        await db.run(lambda: runner.up("0021_key_subscription_workspaces"))
        p = db.param
        await db.aexecute_sql(
            f'INSERT INTO "user" (id, user_name, user_name_key, password_hash, role, created_at) '
            f"VALUES ('u-ann', 'ann', 'ann', 'x', 'USER', {p})", (utcnow(),))
        await db.aexecute_sql(
            f"INSERT INTO workspace (id, name, personal, personal_user_id, created_at) "
            f"VALUES ('w-ann', 'ann', {p}, 'u-ann', {p}), ('w-team', 'team', {p}, NULL, {p})",
            (True, utcnow(), False, utcnow()))
        for key_id, workspace_id in (("k-none", None), ("k-team", "w-team")):
            await db.aexecute_sql(
                f"INSERT INTO api_key (id, user_id, name, key_hash, prefix, scopes, created_at, workspace_id) "
                f"VALUES ({p}, 'u-ann', 'ci', {p}, 'abcd', '[\"run:read\"]', {p}, {p})",
                (key_id, f"hash-{key_id}", utcnow(), workspace_id))
        assert "0022_key_workspace_backfill" in await migrate.upgrade(db)
        with db.bind_ctx([ApiKey]):
            keys = await db.list(ApiKey.select().order_by(ApiKey.id))
            assert [(k.id, k.workspace_id, k.scopes) for k in keys] == [
                ("k-none", "w-ann", ["run:read"]), ("k-team", "w-team", ["run:read"])]
    finally:
        await db.close_pool()
