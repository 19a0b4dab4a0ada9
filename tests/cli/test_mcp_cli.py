"""`orchestra mcp add | list | show | refresh | remove` through a real server and a real
MCP server (the SDK-built streamable-HTTP one on loopback), checked against what the API
then holds; exit codes and one-line errors (SPEC §5, §9)."""

from __future__ import annotations

import json

import pytest

from orchestra.cli.console import ExitCode
from orchestra.testing.fake_mcp import FakeMcpProcess
from tests.cli.cli_harness import api_world, one_error_line


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info, FakeMcpProcess() as fake:
        info["mcp"] = fake
        yield info


def test_add_list_show_refresh_remove(world):
    cli, api, fake = world["cli"], world["api"], world["mcp"]
    done = cli("mcp", "add", "fake", "--url", fake.url, "--header", "Authorization", "--timeout", "9",
               input="Bearer cli-secret-value-5678\n")
    assert done.returncode == 0, done.stderr
    server_id = done.stdout.strip()
    stored = api.get(f"/resource/mcp/{server_id}").json()["server"]
    assert stored["name"] == "fake" and stored["headers"] == {"Authorization": "…5678"}
    assert stored["last_error"] is None, stored["last_error"]
    assert stored["timeout_seconds"] == 9 and "fake.echo" in {t["name"] for t in stored["tools"]}
    assert "added MCP server fake" in done.stderr

    listed = cli("mcp", "list", "--json")
    assert listed.returncode == 0 and [s["server_id"] for s in json.loads(listed.stdout)] == [server_id]
    table = cli("mcp", "list")
    assert table.returncode == 0 and "fake" in table.stdout and "ok" in table.stdout

    shown = cli("mcp", "show", "fake")
    assert shown.returncode == 0 and "…5678" in shown.stdout and "fake.echo" in shown.stdout
    assert "cli-secret" not in shown.stdout
    shown_json = json.loads(cli("mcp", "show", server_id, "--json").stdout)
    assert shown_json == api.get(f"/resource/mcp/{server_id}").json()["server"]

    refreshed = cli("mcp", "refresh", "fake", "--json")
    assert refreshed.returncode == 0, refreshed.stderr
    assert json.loads(refreshed.stdout)["last_error"] is None

    removed = cli("mcp", "remove", "fake", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert api.get(f"/resource/mcp/{server_id}").status_code == 404


def test_refresh_of_an_unreachable_server_exits_6(world):
    cli = world["cli"]
    other = FakeMcpProcess().start()
    try:
        assert cli("mcp", "add", "gone", "--url", other.url, "--timeout", "3").returncode == 0
    finally:
        other.stop()
    done = cli("mcp", "refresh", "gone")
    assert done.returncode == ExitCode.UNAVAILABLE
    assert "could not be reached" in done.stderr
    assert cli("mcp", "remove", "gone", "--yes").returncode == 0


def test_errors_are_one_line_with_their_exit_codes(world):
    cli, fake = world["cli"], world["mcp"]
    done = cli("mcp", "add", "shell", "--command", "sh", "--arg", "-c")
    assert done.returncode == ExitCode.USAGE
    assert "ORCHESTRA_MCP_STDIO_COMMANDS" in one_error_line(done)
    done = cli("mcp", "add", "shell", "--command", "/bin/sh", "--arg", "-c")
    assert done.returncode == ExitCode.USAGE and "bare command name" in one_error_line(done)
    done = cli("mcp", "add", "both", "--url", fake.url, "--command", "x")
    assert done.returncode == ExitCode.USAGE and "either --url" in one_error_line(done)
    done = cli("mcp", "show", "nope")
    assert done.returncode == ExitCode.NOT_FOUND and "unknown MCP server 'nope'" in one_error_line(done)
    done = cli("mcp", "add", "hdr", "--url", fake.url, "--header", "Authorization=Bearer x")
    assert done.returncode == ExitCode.USAGE and "NAME only" in one_error_line(done)
    done = cli("mcp", "add", "hdr", "--url", fake.url, "--header", "Authorization", input="")
    assert done.returncode == ExitCode.USAGE and "no value on stdin" in one_error_line(done)


def test_mcp_and_tool_commands_take_a_workspace(world):
    """SPEC §16: `--workspace` names the workspace whose own MCP servers `mcp …` acts on
    (without it: the instance-wide ones), and whose workers' tools `tool list` lists."""
    cli, api, fake = world["cli"], world["api"], world["mcp"]
    made = api.post("/workspace", json={"name": "mcpteam"})
    assert made.status_code == 201, made.text
    wid = made.json()["workspace_id"]
    done = cli("mcp", "add", "teamfake", "--url", fake.url, "--workspace", "mcpteam")
    assert done.returncode == 0, done.stderr
    server_id = done.stdout.strip()
    [stored] = api.get("/resource/mcp", params={"workspace_id": wid}).json()["servers"]
    assert (stored["server_id"], stored["workspace_id"]) == (server_id, wid)
    assert server_id not in [s["server_id"] for s in api.get("/resource/mcp").json()["servers"]]
    listed = cli("mcp", "list", "--workspace", wid, "--json")
    assert listed.returncode == 0 and [s["server_id"] for s in json.loads(listed.stdout)] == [server_id]
    assert server_id not in cli("mcp", "list", "--json").stdout
    shown = cli("mcp", "show", "teamfake", "--workspace", "mcpteam", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["workspace_id"] == wid, shown.stderr
    assert cli("mcp", "show", "teamfake").returncode == ExitCode.NOT_FOUND
    refreshed = cli("mcp", "refresh", "teamfake", "--workspace", "mcpteam", "--json")
    assert refreshed.returncode == 0 and json.loads(refreshed.stdout)["last_error"] is None, refreshed.stderr
    team_tools = json.loads(cli("tool", "list", "--workspace", "mcpteam", "--json").stdout)
    assert "teamfake.echo" in [t["name"] for t in team_tools]
    assert "teamfake.echo" not in cli("tool", "list", "--json").stdout
    assert cli("mcp", "remove", "teamfake", "--yes").returncode == ExitCode.NOT_FOUND
    gone = cli("mcp", "remove", "teamfake", "--yes", "--workspace", "mcpteam")
    assert gone.returncode == 0, gone.stderr
    assert api.get("/resource/mcp", params={"workspace_id": wid}).json()["servers"] == []
