"""What a call through orchestra's MCP server costs (SPEC §14, issue 28): a `tools/call`
of a one-step template (an HTTP GET to a loopback server) against the same run started by
`POST /run` and read to its end on the SSE stream.

On a real `orchestra serve` (PostgreSQL by default, `--sqlite` for the embedded store),
alternating per call: the JSON API (`POST /run`, then `GET /sse/{trace_id}` to
`run_finished`), and the official SDK's client on one kept connection — in the 2026-07-28
protocol (each call a request of its own) and in a handshake-era session. The overhead is
the MCP call's p50 minus the API's (goal < 10 ms).

    python benchmarks/bench_mcp_server.py [--calls 60] [--pg URL | --sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2  # noqa: E402
from mcp.client.client import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from benchmarks.bench_auth import populate  # noqa: E402
from benchmarks.bench_compose import LoopbackTarget, timed_run  # noqa: E402
from benchmarks.bench_scale import _admin_sql  # noqa: E402
from benchmarks.common import median, orchestra_server, percentile, report  # noqa: E402


class PgDatabase:
    """A fresh PostgreSQL database for the run, dropped afterwards."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.name = f"orchestra_mcp_{uuid.uuid4().hex[:8]}"
        self.url = urlunparse(urlparse(base)._replace(path=f"/{self.name}"))

    def __enter__(self) -> PgDatabase:
        asyncio.run(_admin_sql(self.base, f'CREATE DATABASE "{self.name}"'))
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run(_admin_sql(self.base, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))


async def mcp_times(base: str, token: str, mode: str, calls: int, api_call) -> tuple[list[float], list[float]]:
    """(MCP call ms, API run ms), alternating, on one kept MCP connection."""
    mcp_ms: list[float] = []
    api_ms: list[float] = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(f"{base}/mcp", http_client=http), mode=mode, cache=None) as client:
            for n in range(calls + 3):
                began = time.perf_counter()
                result = await client.call_tool("fetch", {"input": "x"})
                took = (time.perf_counter() - began) * 1000
                assert not result.is_error, result
                api = await asyncio.to_thread(api_call) * 1000
                if n >= 3:  # the first calls warm connections and caches
                    mcp_ms.append(took)
                    api_ms.append(api)
    return mcp_ms, api_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--sqlite", action="store_true", help="the embedded store instead of PostgreSQL")
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    store = nullcontext() if args.sqlite else PgDatabase(args.pg)
    with LoopbackTarget() as target, store as database:
        env = {"ORCHESTRA_ACCESS_TTL": "3600"}
        if database is not None:
            env["ORCHESTRA_DATABASE_URL"] = database.url
        with orchestra_server(env) as (base, _proc, server_env):
            token = populate(base, server_env)
            http = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)
            made = http.post("/workflow/template", json={
                "name": "fetch", "steps": [{"id": "get", "http": {"method": "GET", "url": target.url + "/echo"}}],
                "expose": {"mcp": True}})
            assert made.status_code == 201, made.text
            template_id = made.json()["template_id"]
            store_name = "SQLite" if database is None else "PostgreSQL"
            print(f"MCP tools/call over POST /run + SSE, one-step template, {store_name}, "
                  f"{args.calls} calls each, alternating:")
            for mode, label in (("auto", "2026-07-28"), ("legacy", "handshake session")):
                mcp_ms, api_ms = asyncio.run(mcp_times(base, token, mode, args.calls,
                                                       lambda: timed_run(http, template_id)))
                report(f"  POST /run + SSE p50 (beside {label})", median(api_ms), "ms")
                report(f"  MCP call, {label}, p50", median(mcp_ms), "ms")
                report(f"  MCP call, {label}, p99", percentile(mcp_ms, 99), "ms")
                report(f"  MCP call overhead, {label}, p50", median(mcp_ms) - median(api_ms), "ms", "< 10 ms")


if __name__ == "__main__":
    main()
