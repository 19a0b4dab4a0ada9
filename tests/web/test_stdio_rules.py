"""What a stdio MCP server may run (SPEC §9, issue 23 finding 4), through the API with
`mcp-server-time` from PyPI: a bare command name only (a path → 422 naming `command`),
found on the server's own PATH; env names no runtime or library interprets (→ 422 naming
`env.NAME`); and every rule checked again at each start of the process, so a stored
server the rules refuse does not start."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from orchestra.db.models import McpServer
from orchestra.engine.tools.mcp.stdio import ENV_NAME_PATTERN, env_refusal

MCP = "/api/v1/resource/mcp"


@pytest.fixture
def settings_overrides():
    return {"mcp_stdio_commands": "mcp-server-time"}


def time_server(**overrides) -> dict:
    return {"name": "time", "transport": "stdio", "command": "mcp-server-time",
            "args": ["--local-timezone", "UTC"], **overrides}


async def test_an_env_that_makes_python_run_a_shell_is_refused(client, admin, tmp_path):
    """The reported attack: PYTHONWARNINGS imports `antigravity`, which opens $BROWSER,
    here a shell command. Refused at save; no shell ever runs."""
    marker = tmp_path / "ran"
    env = {"PYTHONWARNINGS": "all:0:antigravity.x:0:0", "BROWSER": f"/bin/sh -c 'touch {marker}' %s"}
    response = await client.post(MCP, json=time_server(env=env), headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == "env.PYTHONWARNINGS"
    await asyncio.sleep(0.5)
    assert not marker.exists()
    assert await client.app.ctx.core.db.count(McpServer.select()) == 0


@pytest.mark.parametrize("name", [
    "PATH", "HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "PYTHONPATH", "PYTHONSTARTUP",
    "BROWSER", "NODE_OPTIONS", "NPM_CONFIG_PREFIX", "PERL5OPT", "RUBYOPT", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS", "BASH_ENV", "ENV", "SHELL", "IFS", "PS4", "GIT_SSH_COMMAND", "SSL_CERT_FILE",
    "HTTPS_PROXY", "http_proxy", "EDITOR", "VISUAL", "PAGER", "TMPDIR", "GCONV_PATH", "LOCPATH",
    "MALLOC_CHECK_", "GLIBC_TUNABLES", "OPENSSL_CONF", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "TZDIR",
    "JAVA_HOME", "lower", "1ST", "A-B",
])
async def test_env_names_a_runtime_interprets_are_refused(client, admin, name):
    response = await client.post(MCP, json=time_server(env={name: "x"}), headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == f"env.{name}"


def test_plain_names_are_accepted_and_the_pattern_says_the_same():
    import re

    pattern = re.compile(ENV_NAME_PATTERN)
    for name in ("GITHUB_TOKEN", "BRAVE_API_KEY", "TZ", "GOOGLE_API_KEY", "MY_SERVICE_URL", "LOG_LEVEL"):
        assert env_refusal(name) is None and pattern.match(name), name
    for name in ("PATH", "PYTHONWARNINGS", "BROWSER", "http_proxy", "_JAVA_OPTIONS", "X_HOME", "LD_AUDIT"):
        assert env_refusal(name) is not None and not pattern.match(name), name


@pytest.mark.parametrize("command", ["/elsewhere/mcp-server-time", "./mcp-server-time", "bin/mcp-server-time",
                                     "../mcp-server-time", "-mcp-server-time"])
async def test_a_command_with_a_path_is_refused(client, admin, command):
    response = await client.post(MCP, json=time_server(command=command), headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == "command"
    assert "bare command name" in response.json()["message"]


async def test_the_command_is_found_on_the_servers_path(client, admin, tmp_path, monkeypatch):
    """A directory placed first on the server's own PATH holds an `mcp-server-time` that
    leaves a mark: it is the one started (the server's PATH decides, not the child's)."""
    marker = tmp_path / "started"
    fake = tmp_path / "bin" / "mcp-server-time"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    real = await client.post(MCP, json=time_server(), headers=admin["headers"])
    assert real.status_code == 201 and real.json()["server"]["last_error"] is None
    assert not marker.exists()
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    sid = real.json()["server_id"]
    refreshed = (await client.post(f"{MCP}/{sid}/refresh", headers=admin["headers"])).json()["server"]
    assert marker.exists() and refreshed["last_error"]


async def test_a_stored_server_the_rules_refuse_does_not_start(client, admin):
    """Stored before these rules (or edited in the store): refresh refuses to start it
    and says why in last_error."""
    core = client.app.ctx.core
    created = await client.post(MCP, json=time_server(), headers=admin["headers"])
    sid = created.json()["server_id"]
    secret_env = core.secrets.encrypt(json.dumps({"PYTHONWARNINGS": "all:0:antigravity.x:0:0"}))
    await McpServer.update(env_encrypted=secret_env, env_hint={"PYTHONWARNINGS": "…"}).where(
        McpServer.id == sid).aexecute()
    error = (await client.post(f"{MCP}/{sid}/refresh", headers=admin["headers"])).json()["server"]["last_error"]
    assert "env.PYTHONWARNINGS" in error and "was not started" in error
    await McpServer.update(env_encrypted=None, env_hint={}, command="/usr/bin/mcp-server-time").where(
        McpServer.id == sid).aexecute()
    error = (await client.post(f"{MCP}/{sid}/refresh", headers=admin["headers"])).json()["server"]["last_error"]
    assert "bare command name" in error
