"""Migration 0025_workspace_providers (SPEC §16): providers stored before it stay
instance-wide (`workspace_id` NULL) with everything they held, and the workers using
them keep them; afterwards a name (ignoring case) is unique among the instance-wide
providers and within each workspace, but one name may be an instance-wide provider and a
provider of each workspace; a workspace's are deleted with it."""

from __future__ import annotations

import pytest
from peewee import IntegrityError
from playhouse.migrations import Runner

from orchestra.db import migrate
from orchestra.db.database import connect
from orchestra.db.models import Provider, Worker, utcnow


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> str:
    """A store with no tables yet: the test migrates it to just before 0025."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'blank.db'}"
    return request.getfixturevalue("blank_postgres_url")


async def test_old_providers_stay_instance_wide_and_names_are_unique_per_workspace(database_url):
    db = connect(database_url)
    p = db.param
    try:
        await db.run(lambda: Runner(db, directory=str(migrate.MIGRATIONS_DIR)).up("0024_workspace_secrets"))
        now = utcnow()
        await db.aexecute_sql(
            f"INSERT INTO provider (id, name, name_key, kind, model_id, base_url, api_key_encrypted, api_key_hint, "
            f"prices, limits, created_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
            ("old", "Main", "main", "deepseek", "deepseek-chat", None, "cipher", "sk-…abcd",
             '{"input_per_mtok":"1","output_per_mtok":"2"}', '{"max_concurrency":2}', now))
        await db.aexecute_sql(f'INSERT INTO "user" (id, user_name, user_name_key, password_hash, role, created_at) '
                              f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})", ("u1", "u1", "u1", "x", "USER", now))
        for wid in ("w1", "w2"):
            await db.aexecute_sql(f"INSERT INTO workspace (id, name, personal, created_at) VALUES ({p}, {p}, {p}, {p})",
                                  (wid, wid, False, now))
        await db.aexecute_sql(
            f"INSERT INTO worker (id, owner_id, name, name_key, description, system_prompt, provider_id, tools, "
            f"workspace_id, created_at, updated_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
            ("wk", "u1", "hand", "hand", "", "", "old", "[]", "w2", now, now))
        assert "0025_workspace_providers" in await migrate.upgrade(db)
        with db.bind_ctx([Provider, Worker]):
            [old] = await db.list(Provider.select())
            assert (old.name, old.workspace_id, old.api_key_encrypted, old.api_key_hint, old.prices, old.limits) == \
                ("Main", None, "cipher", "sk-…abcd", {"input_per_mtok": "1", "output_per_mtok": "2"},
                 {"max_concurrency": 2})
            [worker] = await db.list(Worker.select())
            assert worker.provider_id == "old"

            async def add(id_, name, workspace_id):
                async with db.atomic():
                    await db.aexecute(Provider.insert(id=id_, name=name, name_key=name.casefold(), kind="deepseek",
                                                      model_id="m", workspace_id=workspace_id, created_at=now))

            await add("in-w1", "Main", "w1")
            await add("in-w2", "main", "w2")
            for id_, name, workspace_id in (("again", "MAIN", None), ("again-w1", "mAin", "w1"),
                                            ("same-w1", "Main", "w1")):
                with pytest.raises(IntegrityError):
                    await add(id_, name, workspace_id)
            await db.aexecute_sql(f"DELETE FROM workspace WHERE id = {p}", ("w1",))
            rows = await db.list(Provider.select().order_by(Provider.id))
            assert [(r.id, r.workspace_id) for r in rows] == [("in-w2", "w2"), ("old", None)]
    finally:
        await db.close_pool()
