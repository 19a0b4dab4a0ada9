"""Migration 0026_workspace_mcp_servers (SPEC §16): MCP servers stored before it stay
instance-wide (`workspace_id` NULL) with everything they held; afterwards a name
(ignoring case) is unique among the instance-wide servers and within each workspace, but
one name may be an instance-wide server and a server of each workspace; a workspace's
are deleted with it."""

from __future__ import annotations

import pytest
from peewee import IntegrityError
from playhouse.migrations import Runner

from orchestra.db import migrate
from orchestra.db.database import connect
from orchestra.db.models import McpServer, utcnow


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> str:
    """A store with no tables yet: the test migrates it to just before 0026."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'blank.db'}"
    return request.getfixturevalue("blank_postgres_url")


async def test_old_servers_stay_instance_wide_and_names_are_unique_per_workspace(database_url):
    db = connect(database_url)
    p = db.param
    try:
        await db.run(lambda: Runner(db, directory=str(migrate.MIGRATIONS_DIR)).up("0025_workspace_providers"))
        now = utcnow()
        tools = '[{"name":"echo","description":"e","parameters":{}}]'
        await db.aexecute_sql(
            "INSERT INTO mcp_server (id, name, name_key, transport, url, args, headers_encrypted, headers_hint, "
            "env_hint, timeout_seconds, tools, created_at, updated_at) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
            ("old", "Crm", "crm", "streamable_http", "http://127.0.0.1:9/mcp", "[]", "cipher",
             '{"X-Api-Key":"…abcd"}', "{}", 12.5, tools, now, now))
        for wid in ("w1", "w2"):
            await db.aexecute_sql(f"INSERT INTO workspace (id, name, personal, created_at) VALUES ({p}, {p}, {p}, {p})",
                                  (wid, wid, False, now))
        assert "0026_workspace_mcp_servers" in await migrate.upgrade(db)
        with db.bind_ctx([McpServer]):
            [old] = await db.list(McpServer.select())
            assert (old.name, old.workspace_id, old.headers_encrypted, old.headers_hint, old.timeout_seconds,
                    old.tools) == ("Crm", None, "cipher", {"X-Api-Key": "…abcd"}, 12.5,
                                   [{"name": "echo", "description": "e", "parameters": {}}])

            async def add(id_, name, workspace_id):
                async with db.atomic():
                    await db.aexecute(McpServer.insert(id=id_, name=name, name_key=name.casefold(),
                                                       transport="streamable_http", url="http://127.0.0.1:9/mcp",
                                                       workspace_id=workspace_id))

            await add("in-w1", "Crm", "w1")
            await add("in-w2", "crm", "w2")
            for id_, name, workspace_id in (("again", "CRM", None), ("again-w1", "cRm", "w1"),
                                            ("same-w1", "Crm", "w1")):
                with pytest.raises(IntegrityError):
                    await add(id_, name, workspace_id)
            await db.aexecute_sql(f"DELETE FROM workspace WHERE id = {p}", ("w1",))
            rows = await db.list(McpServer.select().order_by(McpServer.id))
            assert [(r.id, r.workspace_id) for r in rows] == [("in-w2", "w2"), ("old", None)]
    finally:
        await db.close_pool()
