"""The fake MCP server as examples/README starts it (`python -m orchestra.testing.fake_mcp
--port 8765 &`): its stdout and stderr are the user's shell, so a connection, a call and
a stop print nothing there (issue 39, point 10)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request

from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from orchestra.testing.fake_mcp import free_port


def test_a_session_and_a_stop_print_nothing_into_the_shell():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "orchestra.testing.fake_mcp", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "it did not start"
                time.sleep(0.05)

        async def session() -> str:
            async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp")) as client:
                assert "echo" in [tool.name for tool in (await client.list_tools()).tools]
                return (await client.call_tool("echo", {"text": "hi"})).content[0].text

        assert asyncio.run(session()) == "hi"
    finally:
        process.terminate()
        out, err = process.communicate(timeout=10)
    assert (out.decode(), err.decode()) == ("", "")
