"""MCP tools in real runs, on SQLite and PostgreSQL: a worker calls tools of a real
streamable-HTTP MCP server (the SDK's server side, in a child process on loopback) and of
a stdio server installed from PyPI (`mcp-server-time`), on the fake model. SPEC §9."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from orchestra.db.models import McpServer, WorkflowRun
from orchestra.engine.tools import wire_name
from orchestra.services import mcp as mcp_service
from tests.engine.test_engine import (
    events,
    setup_agent,
    start,
    steps_of,
    wait_status,
    worker_step,
)
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_mcp import FakeMcpProcess

PYTHON = sys.executable


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"mcp_stdio_commands": "mcp-server-time,python3,python"}


async def http_server(core, fake: FakeMcpProcess, *, name: str = "fake", timeout: float = 30.0,
                      headers: dict | None = None):
    return await mcp_service.create_server(
        core, name=name, transport="streamable_http", url=fake.url, headers=headers,
        timeout_seconds=timeout,
    )


def results(evs) -> list[dict]:
    return [e.data for e in evs if e.kind == "tool_result"]


async def test_a_worker_calls_an_http_mcp_tool_in_a_run(core, fake_llm, fake_mcp):
    server = await http_server(core, fake_mcp, headers={"X-Api-Key": "secret-value-1234"})
    assert server.last_error is None and {t["name"] for t in server.tools} >= {"echo", "add", "hang"}
    who = await setup_agent(core, fake_llm, tools=("fake.echo", "fake.add", "fake.header"))
    fake_llm.script_tool_calls([(wire_name("fake.echo"), {"text": "hello mcp"}),
                                (wire_name("fake.add"), {"a": 2, "b": 3})])
    fake_llm.script_tool_call(wire_name("fake.header"), {"name": "X-Api-Key"})
    fake_llm.script_text("Done.")
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    evs = await events(core, trace_id)
    calls = [e.data for e in evs if e.kind == "tool_call"]
    # events carry the catalog name; the provider saw names it accepts
    assert [c["name"] for c in calls] == ["fake.echo", "fake.add", "fake.header"]
    offered = {t["function"]["name"] for t in fake_llm.chat_requests[0]["tools"]}
    assert offered == {wire_name(n) for n in ("fake.echo", "fake.add", "fake.header")}
    assert all("." not in name for name in offered)
    out = results(evs)
    assert out[0]["result"] == "hello mcp" and "error" not in out[0]
    assert out[1]["result"].replace(" ", "").replace("\n", "") == '{"sum":5.0}'
    assert out[2]["result"] == "secret-value-1234"  # the stored secret header was sent
    tool_messages = [m for m in fake_llm.chat_requests[1]["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"] == "hello mcp"
    # one session for the whole run, over three calls in two rounds
    assert fake_mcp.stats()["connects"] == 2  # one at create (tool listing), one for the run


async def test_one_session_per_server_per_run_across_steps(core, fake_llm, fake_mcp):
    await http_server(core, fake_mcp)
    before = fake_mcp.stats()["connects"]
    who = await setup_agent(core, fake_llm, tools=("fake.echo",))
    for _ in range(2):  # step a, then step b: a call each
        fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "x"})
        fake_llm.script_text("ok")
    steps = [worker_step(who, "a"), worker_step(who, "b", depends_on=["a"])]
    trace_id = await start(core, who, steps)
    assert (await wait_status(core, trace_id, "succeeded", "failed")).status == "succeeded"
    assert fake_mcp.stats()["connects"] - before == 1
    assert fake_mcp.stats()["calls"] == 2
    # another run opens its own session
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "y"})
    fake_llm.script_text("ok")
    trace_id = await start(core, who, [worker_step(who)])
    assert (await wait_status(core, trace_id, "succeeded", "failed")).status == "succeeded"
    assert fake_mcp.stats()["connects"] - before == 2


async def test_a_run_without_mcp_calls_opens_no_session(core, fake_llm, fake_mcp):
    await http_server(core, fake_mcp)
    before = fake_mcp.stats()["connects"]
    who = await setup_agent(core, fake_llm, tools=("fake.echo",))
    fake_llm.script_text("No tools needed.")
    trace_id = await start(core, who, [worker_step(who)])
    assert (await wait_status(core, trace_id, "succeeded", "failed")).status == "succeeded"
    assert fake_mcp.stats()["connects"] == before


async def test_a_hanging_tool_times_out_as_a_tool_error_and_the_step_goes_on(core, fake_llm, fake_mcp):
    await http_server(core, fake_mcp, timeout=0.5)
    who = await setup_agent(core, fake_llm, tools=("fake.hang", "fake.echo"))
    fake_llm.script_tool_call(wire_name("fake.hang"), {"seconds": 60})
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "still here"})
    fake_llm.script_text("Recovered.")
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=20)
    assert run.status == "succeeded", run.error
    out = results(await events(core, trace_id))
    assert out[0]["result"] is None and "did not answer within 0.5 s" in out[0]["error"]
    assert out[1]["result"] == "still here"  # the same session still serves the run
    assert "did not answer" in fake_llm.chat_requests[1]["messages"][-1]["content"]
    assert (await steps_of(core, trace_id))["a"].output == "Recovered."


async def test_a_tool_error_reaches_the_model(core, fake_llm, fake_mcp):
    await http_server(core, fake_mcp)
    who = await setup_agent(core, fake_llm, tools=("fake.fail",))
    fake_llm.script_tool_call(wire_name("fake.fail"), {"message": "no such row"})
    fake_llm.script_text("It failed.")
    trace_id = await start(core, who, [worker_step(who)])
    assert (await wait_status(core, trace_id, "succeeded", "failed")).status == "succeeded"
    out = results(await events(core, trace_id))
    assert out[0]["result"] is None and "no such row" in out[0]["error"]
    assert "no such row" in fake_llm.chat_requests[1]["messages"][-1]["content"]


async def test_a_server_dying_mid_call_is_a_tool_error(core, fake_llm, fake_mcp):
    await http_server(core, fake_mcp, timeout=5)
    who = await setup_agent(core, fake_llm, tools=("fake.die", "fake.echo"))
    fake_llm.script_tool_call(wire_name("fake.die"), {})
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "after"})
    fake_llm.script_text("Carried on.")
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=30)
    assert run.status == "succeeded", run.error
    out = results(await events(core, trace_id))
    assert out[0]["result"] is None and out[0]["error"]
    assert out[1]["result"] is None and out[1]["error"]  # the server is gone for good
    assert (await steps_of(core, trace_id))["a"].output == "Carried on."


async def test_an_unreachable_server_is_a_tool_error(core, fake_llm, fake_mcp):
    await http_server(core, fake_mcp, timeout=2)
    fake_mcp.stop()
    who = await setup_agent(core, fake_llm, tools=("fake.echo",))
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "x"})
    fake_llm.script_text("It is down.")
    trace_id = await start(core, who, [worker_step(who)])
    assert (await wait_status(core, trace_id, "succeeded", "failed", timeout=20)).status == "succeeded"
    out = results(await events(core, trace_id))
    assert out[0]["result"] is None and "could not be reached" in out[0]["error"]
    # issue 29, item 8: the server's status is that of the last contact, not of the last refresh
    down = await McpServer.aget(McpServer.name == "fake")
    assert down.last_error and "could not be reached" in down.last_error
    fake_mcp.start()
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "back"})
    fake_llm.script_text("It is back.")
    again = await start(core, who, [worker_step(who)])
    assert (await wait_status(core, again, "succeeded", "failed", timeout=20)).status == "succeeded"
    assert results(await events(core, again))[0]["result"] == "back"
    assert (await mcp_service.get_server(core, down.id)).last_error is None


async def test_cancel_during_a_hanging_call_ends_the_run_and_its_session(core, fake_llm, fake_mcp):
    await http_server(core, fake_mcp, timeout=120)
    who = await setup_agent(core, fake_llm, tools=("fake.hang",))
    fake_llm.script_tool_call(wire_name("fake.hang"), {"seconds": 100})
    trace_id = await start(core, who, [worker_step(who)])
    engine = core.engine
    for _ in range(500):
        if fake_mcp.stats()["calls"] == 1:
            break
        await asyncio.sleep(0.02)
    live = engine.runs[trace_id]
    sessions = live.mcp
    assert sessions is not None and sessions.opened == 1
    await engine.cancel(trace_id)
    run = await wait_status(core, trace_id, "cancelled", timeout=10)
    assert run.status == "cancelled"
    assert sessions.closed and not sessions._sessions


async def test_a_stdio_server_from_pypi_in_a_run(core, fake_llm):
    server = await mcp_service.create_server(
        core, name="time", transport="stdio", command="mcp-server-time", args=["--local-timezone", "UTC"],
    )
    assert server.last_error is None, server.last_error
    assert {t["name"] for t in server.tools} == {"get_current_time", "convert_time"}
    who = await setup_agent(core, fake_llm, tools=("time.get_current_time",))
    fake_llm.script_tool_call(wire_name("time.get_current_time"), {"timezone": "Europe/Paris"})
    fake_llm.script_text("It is some time.")
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=30)
    assert run.status == "succeeded", run.error
    out = results(await events(core, trace_id))
    assert json.loads(out[0]["result"])["timezone"] == "Europe/Paris"


async def test_the_assistant_fake_calls_an_mcp_tool_its_prompt_names(core, fake_mcp):
    """What examples/README.md shows: the fake model in `assistant` mode calls the MCP tool
    a step's prompt names, and answers with its result."""
    await http_server(core, fake_mcp, name="demo")
    with FakeLLM(behavior="assistant") as llm:
        who = await setup_agent(core, llm, tools=("calculator", "demo.echo"))
        trace_id = await start(core, who, [worker_step(who, prompt="Use demo.echo on {{input}}")],
                               input="the moon")
        run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    evs = await events(core, trace_id)
    call = next(e.data for e in evs if e.kind == "tool_call")
    assert call["name"] == "demo.echo" and call["arguments"] == {"text": "Use demo.echo on the moon"}
    assert results(evs)[0]["result"] == "Use demo.echo on the moon"
    assert "Use demo.echo on the moon" in (await steps_of(core, trace_id))["a"].output


async def test_hand_back_closes_the_sessions_and_the_resumed_run_opens_its_own(core, fake_llm, fake_mcp):
    """SIGTERM's hand-back closes the run's MCP sessions; whoever resumes the run (here a
    new engine on the same store, as after a restart) opens a session of its own."""
    await http_server(core, fake_mcp)
    who = await setup_agent(core, fake_llm, tools=("fake.echo", "ask_user"))
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "before"})
    fake_llm.script_tool_call("ask_user", {"question": "Go on?"})
    trace_id = await start(core, who, [worker_step(who)])
    await wait_status(core, trace_id, "waiting_reply")
    sessions = core.engine.runs[trace_id].mcp
    assert sessions.opened == 1 and not sessions.closed
    before = fake_mcp.stats()["connects"]
    await core.engine.stop(grace=0.2)
    assert sessions.closed and not sessions._sessions
    assert (await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)).owner_process is None
    # the next engine resumes the run: the step starts again and calls the tool again
    stopped = core.extras.pop("engine")
    core.extras["on_close"] = [hook for hook in core.extras.get("on_close", [])
                               if getattr(hook, "__self__", None) is not stopped]
    fake_llm.script_tool_call(wire_name("fake.echo"), {"text": "after"})
    fake_llm.script_text("Resumed.")
    await core.engine.start()
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=20)
    assert run.status == "succeeded", run.error
    assert fake_mcp.stats()["connects"] == before + 1
    echoes = [r["result"] for r in results(await events(core, trace_id)) if r["name"] == "fake.echo"]
    assert echoes == ["before", "after"]


async def test_runs_waiting_on_mcp_calls_hold_no_store_connection(core, fake_llm, fake_mcp):
    """More runs than the pool has connections (8) wait on a hanging MCP tool at once; the
    store still answers other work meanwhile, which it could not if each waiting run held
    a pooled connection (a read would wait for the pool's timeout and fail)."""
    await http_server(core, fake_mcp, timeout=120)
    who = await setup_agent(core, fake_llm, tools=("fake.hang",))
    runs = 10
    for _ in range(runs):
        fake_llm.script_tool_call(wire_name("fake.hang"), {"seconds": 60})
    traces = [await start(core, who, [worker_step(who)]) for _ in range(runs)]
    for _ in range(1500):  # every run is inside its call
        if fake_mcp.stats()["calls"] == runs:
            break
        await asyncio.sleep(0.02)
    assert fake_mcp.stats()["calls"] == runs

    async def read() -> int:
        return len(await core.db.list(WorkflowRun.select().where(WorkflowRun.trace_id.in_(traces))))

    assert await asyncio.wait_for(asyncio.gather(*(read() for _ in range(12))), timeout=30) == [runs] * 12
    for trace_id in traces:
        await core.engine.cancel(trace_id)
    for trace_id in traces:
        assert (await wait_status(core, trace_id, "cancelled", timeout=20)).status == "cancelled"
