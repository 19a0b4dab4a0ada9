"""MCP server rules below the API (SPEC §9), on both stores where the store matters: the
cache hint across processes, the stdio allow-list checked at every start, the minimal
environment of a stdio server, secrets at rest, 409 while workers use the tools."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys

import pytest

from orchestra.db.models import McpServer
from orchestra.db.signals import PostgresSignals
from orchestra.engine.tools import ToolError
from orchestra.engine.tools.mcp.catalog import server_config
from orchestra.engine.tools.mcp.sessions import RunSessions
from orchestra.errors import ConflictError, ValidationError
from orchestra.services import agents, auth
from orchestra.services import mcp as svc
from orchestra.services import providers as psvc

PYTHON = os.path.basename(sys.executable)
FAKE_STDIO = ["-m", "orchestra.testing.fake_mcp", "--stdio"]


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"mcp_stdio_commands": f"mcp-server-time,{PYTHON}"}


@pytest.fixture(autouse=True)
def _this_python_first_on_path(monkeypatch):
    """A stdio command is a bare name found on the server's PATH: this test's Python."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")


async def test_secrets_are_encrypted_at_rest_and_masked(core, fake_mcp):
    server = await svc.create_server(core, name="fake", transport="streamable_http", url=fake_mcp.url,
                                     headers={"Authorization": "Bearer top-secret-abcd"})
    row = await McpServer.aget(McpServer.id == server.id)
    assert "top-secret" not in json.dumps({k: str(v) for k, v in row.__data__.items()})
    assert svc.server_view(row)["headers"] == {"Authorization": "…abcd"}
    assert server_config(row, core.secrets.decrypt).headers == {"Authorization": "Bearer top-secret-abcd"}
    assert svc.mask_secret("short") == "…"


async def test_delete_names_the_workers_of_every_user(core, fake_mcp):
    server = await svc.create_server(core, name="fake", transport="streamable_http", url=fake_mcp.url)
    provider = await psvc.create_provider(core, name="p", kind="deepseek", model_id="m", api_key="sk-1234567890")
    for name in ("ann", "bob"):
        user = await auth.register(core, user_name=name, password="password-1")
        await agents.create_worker(core, owner_id=user.id, name=f"w-{name}", provider_id=provider.id,
                                   tools=["fake.echo"])
    # a worker whose tools only look alike is not named
    other = await auth.register(core, user_name="cat", password="password-1")
    await agents.create_worker(core, owner_id=other.id, name="w-cat", provider_id=provider.id, tools=[])
    with pytest.raises(ConflictError) as caught:
        await svc.delete_server(core, server_id=server.id)
    assert [w["name"] for w in caught.value.detail["workers"]] == ["w-ann", "w-bob"]
    assert await McpServer.aget_or_none(McpServer.id == server.id) is not None


@pytest.mark.parametrize("both_stores", ["postgres"], indirect=True)  # PostgreSQL only, never a skip
async def test_a_changed_server_reaches_another_process(core, fake_mcp, database_url):
    """On PostgreSQL, the trigger's `cache` hint drops another process's catalog at once
    (one process serves a SQLite store: its own writes drop its catalog)."""
    assert core.is_postgres
    from orchestra.db.database import postgres_params

    other = dataclasses.replace(core, signals=PostgresSignals(postgres_params(database_url)), extras={})
    await other.signals.start()
    try:
        catalog = svc.mcp_catalog(other)
        await catalog.load()
        assert catalog.tools() == []
        await svc.create_server(core, name="fake", transport="streamable_http", url=fake_mcp.url)
        for _ in range(250):  # the hint arrives on the other LISTEN connection
            if not catalog.snapshot.fresh():
                break
            await asyncio.sleep(0.02)
        await catalog.load()
        assert "fake.echo" in {t.name for t in catalog.tools()}
    finally:
        await other.signals.stop()


async def test_a_stdio_server_gets_only_path_home_and_its_own_env(core, monkeypatch):
    monkeypatch.setenv("LEAKY_SECRET", "must-not-pass")
    monkeypatch.setenv("USER", "someone")
    monkeypatch.setenv("SHELL", "/bin/sh")
    server = await svc.create_server(core, name="local", transport="stdio", command=PYTHON,
                                     args=FAKE_STDIO, env={"OWN_TOKEN": "own-value-123456"})
    assert server.last_error is None, server.last_error
    sessions = RunSessions(core.settings.mcp_stdio_allowed, core.settings.egress)
    try:
        names = set((await sessions.call(server_config(server, core.secrets.decrypt), "env", {})).split(","))
    finally:
        await sessions.aclose()
    # LC_CTYPE is Python's own locale coercion in the child (PEP 538), not something we pass
    assert names - {"LC_CTYPE"} == {"PATH", "HOME", "OWN_TOKEN"}
    assert sessions.opened == 1


async def test_stdio_is_checked_again_at_every_start(core):
    server = await svc.create_server(core, name="local", transport="stdio", command=PYTHON,
                                     args=FAKE_STDIO)
    config = server_config(server, core.secrets.decrypt)
    # the operator removed the command from ORCHESTRA_MCP_STDIO_COMMANDS since
    sessions = RunSessions(frozenset({"mcp-server-time"}))
    with pytest.raises(ToolError) as caught:
        await sessions.call(config, "echo", {"text": "x"})
    assert "ORCHESTRA_MCP_STDIO_COMMANDS" in caught.value.message
    await sessions.aclose()
    strict = dataclasses.replace(core, settings=dataclasses.replace(core.settings, mcp_stdio_commands=""))
    refreshed = await svc.refresh_server(strict, server_id=server.id)
    assert "ORCHESTRA_MCP_STDIO_COMMANDS" in refreshed.last_error
    assert {t["name"] for t in refreshed.tools} >= {"echo", "env"}  # the last listing is kept
    with pytest.raises(ValidationError) as refused:
        await svc.update_server(strict, server_id=server.id, name="local", transport="stdio",
                                command=PYTHON, args=FAKE_STDIO)
    assert "ORCHESTRA_MCP_STDIO_COMMANDS" in refused.value.message


async def test_a_run_s_sessions_are_closed_and_a_closed_set_opens_none(core, fake_mcp):
    server = await svc.create_server(core, name="fake", transport="streamable_http", url=fake_mcp.url)
    config = server_config(server, core.secrets.decrypt)
    before = fake_mcp.stats()["connects"]
    sessions = RunSessions(frozenset(), core.settings.egress)
    assert await sessions.call(config, "echo", {"text": "a"}) == "a"
    assert await sessions.call(config, "echo", {"text": "b"}) == "b"
    assert sessions.opened == 1 and fake_mcp.stats()["connects"] == before + 1
    await sessions.aclose()
    with pytest.raises(ToolError):
        await sessions.call(config, "echo", {"text": "c"})
    assert fake_mcp.stats()["connects"] == before + 1


async def test_a_stdio_server_that_dies_at_start_is_reported_in_its_own_words(core):
    """Issue 29, item 8: its stderr's last lines are the error (it was 'Connection closed'),
    without the server's own env secrets."""
    crash = "import os, sys; sys.stderr.write('boom: bad config for ' + os.environ['MY_TOKEN'] + '\\n'); sys.exit(3)"
    server = await svc.create_server(core, name="crashy", transport="stdio", command=PYTHON,
                                     args=["-c", crash], env={"MY_TOKEN": "secret-value-777"}, timeout_seconds=10)
    assert server.last_error is not None
    assert "could not be started" in server.last_error and "boom: bad config for ***" in server.last_error
    assert "secret-value-777" not in server.last_error
