"""With `ORCHESTRA_LOG_FORMAT=json`, every line a real `orchestra serve` writes to stdout
and stderr is one JSON object (SPEC §15): Sanic's own lines, the start banner and the
"no super administrator" hint, the access log, warnings, and a stdio MCP server's
stderr, wrapped line by line.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e


def test_every_line_the_server_writes_is_json(tmp_path):
    server = ServerProcess(tmp_path / "home", env={
        "ORCHESTRA_LOG_FORMAT": "json",
        "ORCHESTRA_ACCESS_LOG": "1",
        "ORCHESTRA_MCP_STDIO_COMMANDS": "mcp-server-time",
        "PYTHONWARNINGS": "always",
    }).start()
    try:
        made = server.cli("user", "create", "root", "--role", "ADMINISTRATOR", "--password-stdin",
                          input="password-123\n")
        assert made.returncode == 0, made.stderr
        with httpx.Client(base_url=f"{server.base_url}/api/v1", timeout=60) as http:
            token = http.post("/auth/login", json={"user_name": "root", "password": "password-123"})
            headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
            # A stdio server that writes to its stderr (argparse's usage and error) and exits.
            http.post("/resource/mcp", headers=headers, json={
                "name": "broken", "transport": "stdio", "command": "mcp-server-time",
                "args": ["--no-such-flag"]})
            working = http.post("/resource/mcp", headers=headers, json={
                "name": "time", "transport": "stdio", "command": "mcp-server-time",
                "args": ["--local-timezone", "UTC"]})
            assert working.status_code == 201, working.text
            http.get("/no/such/route")
            http.post("/auth/login", content=b"{not json")
    finally:
        server.stop()

    lines = [line for line in server.log_path.read_text().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n--- all of it:\n" + "\n".join(lines)) from None
        assert isinstance(record, dict) and {"ts", "level", "msg"} <= set(record), line
        records.append(record)
    messages = [r["msg"] for r in records]
    assert any(m.startswith("orchestra listening on") for m in messages), messages
    assert any("No super administrator yet" in m for m in messages), messages
    child = [r for r in records if r.get("logger") == "orchestra.child"]
    assert any("unrecognized arguments" in r["msg"] and r.get("child") == "mcp:broken" for r in child), child
    assert any(r.get("logger") == "sanic.access" for r in records), messages
