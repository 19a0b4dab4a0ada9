"""`orchestra audit verify` (SPEC §16) against a store edited behind the server's back with
sqlite3: an edited, a removed and a reordered entry are each named; retention's pruning
of an old prefix leaves a chain that verifies from its new first entry."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
from pathlib import Path

import pytest

from orchestra.core import Core
from orchestra.db.audit_models import AuditEntry
from orchestra.db.models import utcnow
from orchestra.services import audit, audit_chain, auth, retention
from orchestra.services.roles import Role
from tests.conftest import FAST_HASH, make_settings

SECRET = "cli-secret-" + "a" * 32


@pytest.fixture
def env(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    return {
        "ORCHESTRA_HOME": str(home),
        "ORCHESTRA_DATABASE_URL": f"sqlite:///{home / 'orchestra.db'}",
        "ORCHESTRA_SECRET_KEY": SECRET,
        "COLUMNS": "200",
        **{f"ORCHESTRA_{k.upper()}": str(v) for k, v in FAST_HASH.items()},
    }


def store(env: dict, fn):
    async def go():
        settings = make_settings(Path(env["ORCHESTRA_HOME"]), env["ORCHESTRA_DATABASE_URL"], secret_key=SECRET)
        core = await Core.open(settings)
        try:
            return await fn(core)
        finally:
            await core.close()

    return asyncio.run(go())


async def five_entries(core: Core) -> list[str]:
    """Five instance-level entries (a user made, promoted four times): their audit ids, oldest first."""
    user = await auth.register(core, user_name="alice", password="password-123")
    for role in (Role.ADMINISTRATOR, Role.USER, Role.ADMINISTRATOR, Role.USER, Role.ADMINISTRATOR):
        await auth.set_role(core, user_id=user.id, new_role=role)
    rows = await core.db.list(AuditEntry.select().order_by(AuditEntry.seq))
    return [row.audit_id for row in rows]


def sql(env: dict, statement: str, *args) -> None:
    path = env["ORCHESTRA_DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute(statement, args)


def verify(cli):
    result = cli("audit", "verify")
    return result.exit_code, (result.stdout + result.stderr).replace("\n", " ")


def test_an_intact_log_verifies(cli, env):
    ids = store(env, five_entries)
    assert len(ids) == 5
    code, text = verify(cli)
    assert code == 0, text
    assert "intact: 5 entries in 1 chain(s)" in text


def test_an_edited_entry_is_named(cli, env):
    ids = store(env, five_entries)
    sql(env, "UPDATE audit_entry SET changes = ? WHERE audit_id = ?",
        '{"role":{"from":"USER","to":"SUPER_ADMINISTRATOR"}}', ids[2])
    code, text = verify(cli)
    assert code == 1 and f"entry {ids[2]} (seq 3) was edited" in text, text


def test_an_edited_and_rehashed_entry_is_found_by_the_next_link(cli, env):
    ids = store(env, five_entries)

    async def forge(core):  # what someone who knows the hash rule could do
        row = await AuditEntry.aget(AuditEntry.audit_id == ids[1])
        row.changes = {"role": {"from": "USER", "to": "SUPER_ADMINISTRATOR"}}
        row.hash = audit.entry_hash(audit.hashed_fields(row))
        await row.asave()

    store(env, forge)
    code, text = verify(cli)
    assert code == 1 and f"entry {ids[2]} (seq 3) does not follow" in text, text


def test_a_removed_entry_is_named_by_the_gap(cli, env):
    ids = store(env, five_entries)
    sql(env, "DELETE FROM audit_entry WHERE audit_id = ?", ids[1])
    code, text = verify(cli)
    assert code == 1 and f"entry seq 2 was removed (the next entry is {ids[2]}, seq 3)" in text, text


def test_removing_the_newest_or_the_oldest_entry_is_found(cli, env):
    ids = store(env, five_entries)
    sql(env, "DELETE FROM audit_entry WHERE audit_id = ?", ids[-1])
    code, text = verify(cli)
    assert code == 1 and "entries after seq 4 were removed (the chain's head is seq 5)" in text, text
    sql(env, "DELETE FROM audit_entry WHERE audit_id = ?", ids[0])
    code, text = verify(cli)
    assert code == 1 and f"entry seq 1 was removed (the next entry is {ids[1]}, seq 2)" in text, text


def test_reordered_entries_are_named(cli, env):
    ids = store(env, five_entries)
    sql(env, "UPDATE audit_entry SET seq = 100 WHERE audit_id = ?", ids[1])
    sql(env, "UPDATE audit_entry SET seq = 2 WHERE audit_id = ?", ids[2])
    sql(env, "UPDATE audit_entry SET seq = 3 WHERE audit_id = ?", ids[1])
    code, text = verify(cli)
    assert code == 1 and f"entry {ids[2]} (seq 2) was edited" in text, text


def test_retention_prunes_a_whole_prefix_and_the_rest_still_verifies(cli, env):
    ids = store(env, five_entries)
    old = (utcnow() - dt.timedelta(days=400)).isoformat(sep=" ")
    # the first three are old (their times edited: the chain no longer verifies ...)
    for audit_id in ids[:3]:
        sql(env, "UPDATE audit_entry SET at = ? WHERE audit_id = ?", old, audit_id)
    assert verify(cli)[0] == 1

    async def prune(core):  # ... until retention removes them, the server's round as it runs it
        return await retention.prune(core, older_than=None), \
            await core.db.list(AuditEntry.select().order_by(AuditEntry.seq))

    _, left = store(env, prune)
    assert [row.audit_id for row in left] == ids[3:]
    code, text = verify(cli)
    assert code == 0 and "intact: 2 entries" in text, text
    sql(env, "DELETE FROM audit_entry WHERE audit_id = ?", ids[3])  # the new first one
    code, text = verify(cli)
    assert code == 1 and f"entry seq 4 was removed (the next entry is {ids[4]}, seq 5)" in text, text


def test_pruning_keeps_entries_younger_than_the_retention(env):
    store(env, five_entries)

    async def prune(core):
        removed = await audit_chain.prune(core, older_than=dt.timedelta(days=365))
        return removed, (await audit_chain.verify(core)).intact

    assert store(env, prune) == (0, True)
