"""`/mcp` is built on its first request (web/mcp_host.py): a server that serves none
never imports the MCP SDK's server side, and requests that arrive together before it
is built share one endpoint."""

from __future__ import annotations

import asyncio
import subprocess
import sys

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def test_building_and_importing_the_server_leaves_the_mcp_sdk_unimported():
    script = (
        "import sys\n"
        "from orchestra.cli import serve\n"
        "from orchestra.web.app import create_app\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'mcp_types'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_requests_that_arrive_together_share_one_endpoint(client, users):
    alice = await users.make("alice")
    assert client.app.ctx.mcp.endpoint is None  # nothing built before the first request

    async def ping(n: int) -> int:
        answer = await client.post("/mcp", headers={**alice["headers"], **ACCEPT}, json={
            "jsonrpc": "2.0", "id": n, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}})
        return answer.status_code

    assert await asyncio.gather(*(ping(n) for n in range(5))) == [200] * 5
    first = client.app.ctx.mcp.endpoint
    assert first is not None
    assert await ping(9) == 200
    assert client.app.ctx.mcp.endpoint is first
