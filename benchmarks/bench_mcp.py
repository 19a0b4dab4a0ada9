"""MCP benchmark (issue 16, SPEC §9): what orchestra adds to an MCP tool call, and how many
sessions a run opens.

1. Overhead per call: the same `echo` tool of a real streamable-HTTP MCP server (the
   SDK-built `orchestra.testing.fake_mcp`, in a child process on loopback), called
   alternately (a) straight through one open `mcp.Client` and (b) the way a run calls
   it — `ToolRegistry.run` → the MCP tool → the run's session (argument check, its own
   task, the timeout, the session-loss watch, the result turned into text). Median of
   (b) minus median of (a)                                        goal < 5 ms
2. Sessions per run: real runs on an in-process engine (SQLite, the fake model scripted
   to call tools), counted by the MCP servers themselves: a run calling two servers
   several times over two steps, and a run calling none      goal: one per server used

Run from the project root: `python benchmarks/bench_mcp.py [--calls 300]` (< 1 minute).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestra.egress import EgressPolicy  # noqa: E402
from orchestra.engine.tools import ToolContext, default_registry, wire_name  # noqa: E402
from orchestra.engine.tools.mcp.catalog import McpTool  # noqa: E402
from orchestra.engine.tools.mcp.client import McpServerConfig, connect, list_tools  # noqa: E402
from orchestra.engine.tools.mcp.sessions import RunSessions  # noqa: E402
from orchestra.testing.fake_llm import FakeLLM  # noqa: E402
from orchestra.testing.fake_mcp import FakeMcpProcess  # noqa: E402


async def overhead(url: str, calls: int) -> tuple[float, float]:
    """(median ms direct, median ms through orchestra), calls interleaved."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    config = McpServerConfig("bench", "bench", "streamable_http", url=url)
    loopback = EgressPolicy.parse("127.0.0.1")  # the fake MCP server listens on loopback
    async with connect(config, frozenset(), loopback) as probe:
        listed = {t["name"]: t for t in await list_tools(probe)}
    registry = default_registry()
    tool = McpTool(config, listed["echo"])
    registry.register(tool)
    sessions = RunSessions(frozenset(), loopback)
    ctx = ToolContext(user_id="bench", mcp=sessions)
    direct_ms, ours_ms = [], []
    async with Client(streamable_http_client(url), cache=None) as client:
        await client.call_tool("echo", {"text": "warm"})
        await registry.run(tool.name, {"text": "warm"}, ctx)  # opens the run's session
        for i in range(calls):
            started = time.perf_counter()
            await client.call_tool("echo", {"text": f"call {i}"})
            direct_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await registry.run(tool.name, {"text": f"call {i}"}, ctx)
            ours_ms.append((time.perf_counter() - started) * 1000)
    await sessions.aclose()
    return statistics.median(direct_ms), statistics.median(ours_ms)


async def sessions_per_run(first: FakeMcpProcess, second: FakeMcpProcess) -> tuple[dict, dict]:
    """Connections each server saw for a run using both (3 + 1 calls over two steps),
    and for a run that calls no tool."""
    from orchestra.core import Core
    from orchestra.db.models import WorkflowRun
    from orchestra.services import agents, auth, providers, runs, templates
    from orchestra.services import mcp as mcp_service
    from orchestra.settings import Settings

    with tempfile.TemporaryDirectory() as home, FakeLLM() as llm:
        settings = Settings.from_env(env={}, home=Path(home), secret_key="bench-" + "x" * 40,
                                     argon2_time_cost=1, argon2_memory_cost=8, argon2_parallelism=1,
                                     egress_allow="127.0.0.1")  # the fakes listen on loopback
        core = await Core.open(settings)
        try:
            user = await auth.register(core, user_name="bench", password="password-123")
            provider = await providers.create_provider(
                core, name="fake", kind="openai_compatible", model_id="fake-model",
                base_url=llm.base_url, api_key="k")
            await mcp_service.create_server(core, name="one", transport="streamable_http", url=first.url)
            await mcp_service.create_server(core, name="two", transport="streamable_http", url=second.url)
            worker = await agents.create_worker(core, owner_id=user.id, name="w", provider_id=provider.id,
                                                tools=["one.echo", "two.echo"])
            step = {"agent": {"worker": worker.id}, "prompt": "go"}
            template = await templates.create_template(core, owner_id=user.id, is_admin=False, name="t", steps=[
                {"id": "a", **step}, {"id": "b", **step, "depends_on": ["a"]}])

            async def run(script) -> None:
                script()
                before = (first.stats()["connects"], second.stats()["connects"])
                started = await runs.start_run(core, user_id=user.id, is_admin=False, template_id=template.id)
                for _ in range(1500):
                    row = await WorkflowRun.aget(WorkflowRun.trace_id == started.trace_id)
                    if row.status in ("succeeded", "failed", "cancelled", "interrupted"):
                        break
                    await asyncio.sleep(0.02)
                assert row.status == "succeeded", row.error
                return {"one": first.stats()["connects"] - before[0], "two": second.stats()["connects"] - before[1]}

            def both() -> None:
                llm.script_tool_calls([(wire_name("one.echo"), {"text": "1"}), (wire_name("two.echo"), {"text": "2"})])
                llm.script_tool_call(wire_name("one.echo"), {"text": "3"})
                llm.script_text("a done")
                llm.script_tool_call(wire_name("one.echo"), {"text": "4"})
                llm.script_text("b done")

            def none() -> None:
                llm.script_text("a done")
                llm.script_text("b done")

            return await run(both), await run(none)
        finally:
            await core.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per path (interleaved)")
    args = parser.parse_args()
    with FakeMcpProcess() as first, FakeMcpProcess() as second:
        direct, ours = asyncio.run(overhead(first.url, args.calls))
        used, unused = asyncio.run(sessions_per_run(first, second))
    added = ours - direct
    print(f"MCP tool call, median of {args.calls}: direct SDK {direct:.2f} ms, "
          f"through orchestra {ours:.2f} ms, added {added:.2f} ms (goal < 5 ms) "
          f"{'OK' if added < 5 else 'MISSED'}")
    print(f"sessions opened by a run calling two servers (4 calls, 2 steps): {used} "
          f"(goal: one per server) {'OK' if used == {'one': 1, 'two': 1} else 'MISSED'}")
    print(f"sessions opened by a run calling no MCP tool: {unused} "
          f"{'OK' if unused == {'one': 0, 'two': 0} else 'MISSED'}")


if __name__ == "__main__":
    main()
