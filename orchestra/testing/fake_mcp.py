"""A small real MCP server, built on the official SDK's server side, for tests, the
benchmark and trying MCP tools offline.

Tools: `echo` (text), `add` (structured content), `header` (a request header as the
server received it), `env` (the names of its environment variables), `fail` (answers a
tool error), `hang` (answers after a wait) and `die` (the process exits mid-call). Over
streamable HTTP, `GET /stats` answers `{"connects": n, "calls": n}`: how many clients
connected (a `server/discover` or `initialize` request each), how many tools were called.

Run: `python -m orchestra.testing.fake_mcp --port 8765` (streamable HTTP on loopback,
endpoint `/mcp`) or `python -m orchestra.testing.fake_mcp --stdio`; it logs nothing but
warnings and errors (`--log-level INFO` for more).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel


class Sum(BaseModel):
    sum: float


CONNECT_METHODS = (b'"server/discover"', b'"initialize"')


def build(name: str = "fake", log_level: str = "WARNING") -> tuple[MCPServer, dict[str, int]]:
    """The server with its tools, and its counters (`connects`, `calls`). It logs only
    warnings and errors by default: started with `&` from a shell, its INFO lines (the
    session manager starting, stopping) would print into the user's terminal."""
    server = MCPServer(name, log_level=log_level)
    stats = {"connects": 0, "calls": 0}

    def seen(ctx: Context) -> None:
        stats["calls"] += 1

    @server.tool(description="Answer the text it is given.")
    def echo(text: str, ctx: Context) -> str:
        seen(ctx)
        return text

    @server.tool(description="Add two numbers; answers structured content {sum}.")
    def add(a: float, b: float, ctx: Context) -> Sum:
        seen(ctx)
        return Sum(sum=a + b)

    @server.tool(description="The value of one request header (empty when absent).")
    def header(name: str, ctx: Context) -> str:
        seen(ctx)
        return (ctx.headers or {}).get(name.lower(), "")

    @server.tool(description="The names of this server's environment variables, sorted.")
    def env(ctx: Context) -> str:
        seen(ctx)
        return ",".join(sorted(os.environ))

    @server.tool(description="Fail with the given message.")
    def fail(message: str, ctx: Context) -> str:
        seen(ctx)
        raise ToolError(message)

    @server.tool(description="Wait this many seconds before answering.")
    async def hang(seconds: float, ctx: Context) -> str:
        seen(ctx)
        await anyio.sleep(seconds)
        return "done waiting"

    @server.tool(description="End the server process in the middle of the call.")
    def die(ctx: Context) -> str:
        seen(ctx)
        os._exit(3)

    @server.custom_route("/stats", methods=["GET"])
    async def stats_route(request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(stats)

    return server, stats


def http_app(server: MCPServer, stats: dict[str, int]) -> Any:
    """The streamable-HTTP ASGI app, counting the requests that open a connection."""
    inner = server.streamable_http_app()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await inner(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if any(method in body for method in CONNECT_METHODS):
            stats["connects"] += 1
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await inner(scope, replay, send)

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeMcpProcess:
    """The streamable-HTTP server in a child process on a free loopback port (so that
    `die` ends only it): `url` is its MCP endpoint, `stats()` its counters. Use as a
    context manager; `start()` again after a `die`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/mcp"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> FakeMcpProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "orchestra.testing.fake_mcp", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stats()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the fake MCP server did not start") from None
                time.sleep(0.05)

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.base}/stats", timeout=5) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def __enter__(self) -> FakeMcpProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--stdio", action="store_true", help="serve on stdin/stdout")
    parser.add_argument("--log-level", default="WARNING", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        help="what it logs to stderr (default WARNING: quiet in a shell)")
    args = parser.parse_args(argv)
    server, stats = build(log_level=args.log_level)
    if args.stdio:
        server.run("stdio")
        return
    import uvicorn

    uvicorn.run(http_app(server, stats), host="127.0.0.1", port=args.port, log_level=args.log_level.lower(),
                lifespan="on")


if __name__ == "__main__":
    main()
