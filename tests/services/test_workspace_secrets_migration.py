"""Migration 0024_workspace_secrets (SPEC §16): secrets stored before it stay
instance-wide (`workspace_id` NULL) with their values; afterwards a name is unique among
the instance-wide secrets and within each workspace, but one name may be an
instance-wide secret and a secret of each workspace; a workspace's are deleted with it."""

from __future__ import annotations

import pytest
from peewee import IntegrityError
from playhouse.migrations import Runner

from orchestra.db import migrate
from orchestra.db.database import connect
from orchestra.db.models import Secret, utcnow


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> str:
    """A store with no tables yet: the test migrates it to just before 0024."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'blank.db'}"
    return request.getfixturevalue("blank_postgres_url")


async def test_old_secrets_stay_instance_wide_and_names_are_unique_per_workspace(database_url):
    db = connect(database_url)
    p = db.param
    try:
        await db.run(lambda: Runner(db, directory=str(migrate.MIGRATIONS_DIR)).up("0023_workspace_month"))
        now = utcnow()
        await db.aexecute_sql(
            f"INSERT INTO secret (id, name, value_encrypted, hint, hosts, created_at, updated_at) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})", ("old", "CRM_KEY", "cipher", "…", '["a.example"]', now, now))
        for wid in ("w1", "w2"):
            await db.aexecute_sql(f"INSERT INTO workspace (id, name, personal, created_at) VALUES ({p}, {p}, {p}, {p})",
                                  (wid, wid, False, now))
        assert "0024_workspace_secrets" in await migrate.upgrade(db)
        with db.bind_ctx([Secret]):
            [old] = await db.list(Secret.select())
            assert (old.name, old.workspace_id, old.value_encrypted, old.hosts) == ("CRM_KEY", None, "cipher",
                                                                                    ["a.example"])

            async def add(id_, workspace_id):
                async with db.atomic():
                    await db.aexecute(Secret.insert(id=id_, name="CRM_KEY", value_encrypted="c", hint="…",
                                                    workspace_id=workspace_id))

            await add("in-w1", "w1")
            await add("in-w2", "w2")
            for id_, workspace_id in (("again", None), ("again-w1", "w1")):
                with pytest.raises(IntegrityError):
                    await add(id_, workspace_id)
            await db.aexecute_sql(f"DELETE FROM workspace WHERE id = {p}", ("w1",))
            rows = await db.list(Secret.select().order_by(Secret.id))
            assert [(r.id, r.workspace_id) for r in rows] == [("in-w2", "w2"), ("old", None)]
    finally:
        await db.close_pool()
