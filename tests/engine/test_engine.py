"""The engine against the real fake provider (FakeLLM on loopback) and a real store."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from orchestra.db.models import RunEvent, RunStep, WorkflowRun
from orchestra.engine.prompts import render_prompt
from orchestra.engine.tools import Tool, ToolContext
from orchestra.errors import ConflictError
from orchestra.services import agents, auth, providers, runs, templates
from tests.fakes.fake_llm import FakeLLM


async def setup_agent(core, fake: FakeLLM, *, name: str = "alice", api_key: str = "test-key",
                      tools: tuple[str, ...] = ("calculator", "ask_user")) -> dict[str, Any]:
    """A user, a provider pointed at `fake`, and a worker using it."""
    user = await auth.register(core, user_name=name, password="password-123")
    provider = await providers.create_provider(
        core, name=f"fake-{name}", kind="openai_compatible", model_id="fake-model",
        api_key=api_key, base_url=fake.base_url,
    )
    worker = await agents.create_worker(
        core, owner_id=user.id, name="helper", provider_id=provider.id, tools=list(tools),
        system_prompt="You help.",
    )
    engine = core.engine
    engine.agent_steps.retry_base_delay = 0.01
    return {"user_id": user.id, "worker_id": worker.id, "provider_id": provider.id}


async def start(core, who: dict, steps: list[dict], *, input: str = "hello") -> str:
    template = await templates.create_template(
        core, owner_id=who["user_id"], is_admin=False, name=f"t{time.monotonic_ns()}", steps=steps
    )
    run = await runs.start_run(
        core, user_id=who["user_id"], is_admin=False, template_id=template.id, input=input
    )
    await until_live_if_claimed(core, run.trace_id)
    return run.trace_id


async def until_live_if_claimed(core, trace_id: str, timeout: float = 5.0) -> None:
    """A run this process stored claimed is in `engine.runs` once its task is set up; the
    engine's first start races its own claim loop for it, which registers it a few awaits
    later. Wait out that window (a run left queued, or already ended, is returned at once)."""
    deadline = time.monotonic() + timeout
    while trace_id not in core.engine.runs and time.monotonic() < deadline:
        stored = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
        if stored.owner_process is None or stored.status not in ("running", "waiting_reply"):
            return
        await asyncio.sleep(0.01)


async def wait_status(core, trace_id: str, *statuses: str, timeout: float = 10.0) -> WorkflowRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
        if run.status in statuses:
            return run
        await asyncio.sleep(0.02)
    raise AssertionError(f"run stayed {run.status}, expected {statuses}")


async def events(core, trace_id: str) -> list[RunEvent]:
    return await core.db.list(RunEvent.select().where(RunEvent.run == trace_id).order_by(RunEvent.seq))


async def steps_of(core, trace_id: str) -> dict[str, RunStep]:
    return {s.step_id: s for s in await core.db.list(RunStep.select().where(RunStep.run == trace_id))}


def kinds(evs) -> list[str]:
    return [e.kind for e in evs]


def worker_step(who, step_id="a", prompt="Say {{input}}", depends_on=()):
    return {"id": step_id, "agent": {"worker": who["worker_id"]}, "prompt": prompt,
            "depends_on": list(depends_on)}


async def test_single_step_streams_tokens_and_succeeds(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_text("one two three four", usage=(7, 4))
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded" and run.started_at and run.finished_at
    evs = await events(core, trace_id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert kinds(evs)[:2] == ["run_started", "step_started"]
    assert kinds(evs)[-2:] == ["step_finished", "run_finished"]
    tokens = [e.data["text"] for e in evs if e.kind == "token"]
    assert "".join(tokens) == "one two three four"
    for e in evs:
        assert e.data["trace_id"] == trace_id and e.data["seq"] == e.seq and e.data["ts"].endswith("Z")
    assert evs[1].data["step_id"] == "a" and evs[1].data["prompt"] == "Say hello"
    step = (await steps_of(core, trace_id))["a"]
    assert step.status == "succeeded" and step.output == "one two three four"
    assert step.usage == {"prompt_tokens": 7, "completion_tokens": 4}
    sent = fake_llm.chat_requests[0]["messages"]
    assert sent[0] == {"role": "system", "content": "You help."}
    assert sent[-1]["content"] == "Say hello"


async def test_tokens_are_coalesced(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    text = "".join(f"w{i} " for i in range(40))
    fake_llm.script_text(text, chunks=40, delay=0.005)  # ~0.2 s of streaming
    trace_id = await start(core, who, [worker_step(who)])
    await wait_status(core, trace_id, "succeeded")
    tokens = [e.data["text"] for e in await events(core, trace_id) if e.kind == "token"]
    assert "".join(tokens) == text
    assert 1 < len(tokens) < 20  # batched about every 50 ms, not one event per chunk


async def test_tool_call_is_run_and_fed_back(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_tool_call("calculator", {"expression": "6*7"})
    fake_llm.script_text("It is 42.")
    trace_id = await start(core, who, [worker_step(who)])
    await wait_status(core, trace_id, "succeeded")
    evs = await events(core, trace_id)
    call = next(e for e in evs if e.kind == "tool_call")
    result = next(e for e in evs if e.kind == "tool_result")
    assert call.data["name"] == "calculator" and call.data["arguments"] == {"expression": "6*7"}
    assert result.data["call_id"] == call.data["call_id"] and result.data["result"] == "42"
    assert "error" not in result.data
    tool_msg = fake_llm.chat_requests[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["content"] == "42"
    assert (await steps_of(core, trace_id))["a"].output == "It is 42."


async def test_retryable_429_is_retried(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_error(429, "Rate limit reached", retry_after=0)
    fake_llm.script_text("after the wait")
    trace_id = await start(core, who, [worker_step(who)])
    await wait_status(core, trace_id, "succeeded")
    assert len(fake_llm.chat_requests) == 2
    assert (await steps_of(core, trace_id))["a"].output == "after the wait"


async def test_401_fails_the_step_with_the_provider_message(core, fake_llm):
    who = await setup_agent(core, fake_llm, api_key="bad-key")
    trace_id = await start(core, who, [worker_step(who), worker_step(who, "b", depends_on=["a"])])
    run = await wait_status(core, trace_id, "failed", "succeeded")
    assert run.status == "failed" and "Incorrect API key provided" in run.error
    evs = await events(core, trace_id)
    failed = next(e for e in evs if e.kind == "step_failed")
    assert failed.data["step_id"] == "a" and "Incorrect API key provided" in failed.data["error"]
    assert kinds(evs)[-1] == "run_failed" and evs[-1].data["status"] == "failed"
    assert not any(e.kind == "step_started" and e.data["step_id"] == "b" for e in evs)
    rows = await steps_of(core, trace_id)
    assert rows["a"].status == "failed" and rows["b"].status == "skipped"
    assert len(fake_llm.chat_requests) == 1  # not retried


async def test_stream_cut_after_tokens_fails_without_retry(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_cut("partial answer that never ends", after_chunks=2)
    fake_llm.script_text("should not be asked for")
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "failed", "succeeded")
    assert run.status == "failed"
    evs = await events(core, trace_id)
    assert any(e.kind == "token" for e in evs)
    assert kinds(evs)[-2:] == ["step_failed", "run_failed"]
    assert len(fake_llm.chat_requests) == 1


async def test_stream_cut_before_tokens_is_retried(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_cut("x", after_chunks=0)
    fake_llm.script_text("second try")
    trace_id = await start(core, who, [worker_step(who)])
    await wait_status(core, trace_id, "succeeded")
    assert (await steps_of(core, trace_id))["a"].output == "second try"


class _Boom(Tool):
    name = "boom"
    description = "Always raises."
    parameters = {"type": "object", "properties": {}}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("kaboom")


async def test_a_tool_that_raises_is_reported_to_the_model(core, fake_llm):
    core.tool_registry.register(_Boom())
    who = await setup_agent(core, fake_llm, tools=("calculator",))
    # the worker's tools are checked at creation; offer boom through the registry override
    from orchestra.db.models import Worker
    await core.db.aexecute(Worker.update(tools=["boom"]).where(Worker.id == who["worker_id"]))
    core.agent_cache.invalidate()
    fake_llm.script_tool_call("boom", {})
    fake_llm.script_text("I could not do it.")
    trace_id = await start(core, who, [worker_step(who)])
    await wait_status(core, trace_id, "succeeded", "failed")
    evs = await events(core, trace_id)
    result = next(e for e in evs if e.kind == "tool_result")
    assert result.data["result"] is None and "kaboom" in result.data["error"]
    assert "kaboom" in fake_llm.chat_requests[1]["messages"][-1]["content"]
    assert (await steps_of(core, trace_id))["a"].status == "succeeded"


@pytest.fixture
def settings_overrides():
    return {"llm_max_tool_rounds": 2}


async def test_tool_rounds_are_bounded(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    for _ in range(3):
        fake_llm.script_tool_call("calculator", {"expression": "1+1"})
    trace_id = await start(core, who, [worker_step(who)])
    run = await wait_status(core, trace_id, "failed", "succeeded")
    assert run.status == "failed" and "2 tool rounds" in run.error
    assert len(fake_llm.chat_requests) == 3


async def test_independent_steps_run_concurrently(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    # each answer is held until both requests arrived: run one after the other, the
    # first would be refused (an error, no retry helps) and the run would fail
    fake_llm.script_text("left", wait_for_requests=2)
    fake_llm.script_text("right", wait_for_requests=2)
    fake_llm.script_text("joined")
    steps = [worker_step(who, "l"), worker_step(who, "r"),
             worker_step(who, "j", "{{steps.l.output}}+{{steps.r.output}}", ["l", "r"])]
    trace_id = await start(core, who, steps)
    await wait_status(core, trace_id, "succeeded")
    assert fake_llm.chat_requests[2]["messages"][-1]["content"] in ("left+right", "right+left")


async def test_human_step_and_ask_user_wait_for_replies(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_tool_call("ask_user", {"question": "Which colour?"})
    fake_llm.script_text("Blue it is.")
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "Name for {{input}}?", "depends_on": []},
             worker_step(who, "w", "Use {{steps.h.output}}", ["h"])]
    trace_id = await start(core, who, steps, input="cat")
    kw = {"user_id": who["user_id"], "is_admin": False, "trace_id": trace_id}
    await wait_status(core, trace_id, "waiting_reply")
    run = await runs.get_run(core, **kw)
    pending = await runs.pending_replies(core, run)
    assert pending[0]["prompt"] == "Name for cat?" and pending[0]["step_id"] == "h"
    with pytest.raises(ConflictError):
        await runs.reply(core, **kw, content="x", request_id="stale")
    await runs.reply(core, **kw, content="Tom", request_id=pending[0]["request_id"])
    await wait_status(core, trace_id, "waiting_reply", "succeeded")
    await wait_status(core, trace_id, "waiting_reply")
    answered = await runs.reply(core, **kw, content="blue")
    assert answered["step_id"] == "w"
    await wait_status(core, trace_id, "succeeded")
    with pytest.raises(ConflictError):
        await runs.reply(core, **kw, content="too late")
    evs = await events(core, trace_id)
    assert kinds(evs).count("reply_requested") == 2 and kinds(evs).count("reply_received") == 2
    asked = [e for e in evs if e.kind == "reply_requested"][1]
    assert asked.data["prompt"] == "Which colour?" and asked.data["request_id"]
    assert fake_llm.chat_requests[0]["messages"][-1]["content"] == "Use Tom"
    assert fake_llm.chat_requests[1]["messages"][-1]["content"] == "blue"


async def test_cancel_ends_a_waiting_run(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "?", "depends_on": []}]
    trace_id = await start(core, who, steps)
    await wait_status(core, trace_id, "waiting_reply")
    kw = {"user_id": who["user_id"], "is_admin": False, "trace_id": trace_id}
    run = await runs.cancel_run(core, **kw)
    assert run.status == "cancelled"
    evs = await events(core, trace_id)
    assert evs[-1].kind == "run_cancelled" and evs[-1].data["status"] == "cancelled"
    assert (await steps_of(core, trace_id))["h"].status == "cancelled"
    with pytest.raises(ConflictError):
        await runs.cancel_run(core, **kw)
    assert not core.engine.is_live(trace_id)


async def test_engine_stop_hands_a_waiting_run_back(core, fake_llm):
    """A graceful stop gives the run back to the store (its lease ended now) instead of
    ending it: another process, or the next start, goes on."""
    who = await setup_agent(core, fake_llm)
    trace_id = await start(core, who, [{"id": "h", "agent": {"human": True}, "prompt": "?"}])
    await wait_status(core, trace_id, "waiting_reply")
    await core.engine.stop(grace=0.2)
    run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert run.status == "waiting_reply"
    assert run.owner_process is None and run.lease_until is None and run.attempts == 1
    assert (await events(core, trace_id))[-1].data.get("status") != "interrupted"
    assert [e.kind for e in await events(core, trace_id)] == [
        "run_started", "step_started", "reply_requested"]


async def test_deleting_the_user_cancels_their_runs(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    await auth.register(core, user_name="keeper", password="password-123")
    trace_id = await start(core, who, [{"id": "h", "agent": {"human": True}, "prompt": "?"}])
    await wait_status(core, trace_id, "waiting_reply")
    assert core.engine.is_live(trace_id)
    await auth.delete_user(core, user_id=who["user_id"])
    assert not core.engine.is_live(trace_id)
    assert await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id) is None


async def test_deleted_worker_fails_the_step(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    template = await templates.create_template(
        core, owner_id=who["user_id"], is_admin=False, name="t", steps=[worker_step(who)]
    )
    await agents.delete_worker(core, owner_id=who["user_id"], worker_id=who["worker_id"])
    run = await runs.start_run(core, user_id=who["user_id"], is_admin=False, template_id=template.id)
    run = await wait_status(core, run.trace_id, "failed", "succeeded")
    assert "no longer exists" in run.error


async def test_node_without_provider_fails_clearly(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    step = {"id": "p", "agent": {"node": "planner"}, "prompt": "Plan {{input}}"}
    trace_id = await start(core, who, [step])
    run = await wait_status(core, trace_id, "failed", "succeeded")
    assert "planner" in run.error and "no provider" in run.error


async def test_render_prompt():
    out = await render_prompt("{{ input }}/{{steps.a.output}}/{{ size(input) + 1 }}", input="i", outputs={"a": "A"})
    assert out == "i/A/2"
    # SPEC §7: anything else between the braces is CEL; an unknown name fails, naming it
    # (the template check refuses it on save, so only a hand-made run can meet this).
    from orchestra.language.expressions import ExpressionError

    with pytest.raises(ExpressionError, match="expression `x`"):
        await render_prompt("{{x}}", input="i", outputs={})


async def orphan(core, user_id: str, *, attempts: int) -> WorkflowRun:
    """A run left `waiting_reply` by a process that died: its lease has run out."""
    from orchestra.engine.store.events import EventLog

    steps = [{"id": "h", "agent": {"human": True}, "prompt": "?", "depends_on": []}]
    run = await WorkflowRun.acreate(
        owner=user_id, template_name="t", steps=steps, status="waiting_reply",
        owner_process="dead-host:1:x", lease_until=time.time() - 1, attempts=attempts,
    )
    await RunStep.acreate(run=run.trace_id, step_id="h", status="waiting_reply")
    log = EventLog(core.db)
    await log.append(run.trace_id, "run_started")
    await log.append(run.trace_id, "step_started", {"prompt": "?"}, step_id="h")
    await log.append(run.trace_id, "reply_requested", {"request_id": "r1", "prompt": "?"}, step_id="h")
    return run


async def test_an_orphaned_run_is_resumed_and_its_question_stays_open(core):
    user = await auth.register(core, user_name="orphan", password="password-123")
    run = await orphan(core, user.id, attempts=1)
    await core.engine.start()
    await wait_for_kind(core, run.trace_id, "run_resumed")
    resumed = (await events(core, run.trace_id))[-1]
    assert resumed.data["attempt"] == 2 and resumed.data["restarted_steps"] == []
    kw = {"user_id": user.id, "is_admin": False, "trace_id": run.trace_id}
    assert await runs.reply(core, content="yes", request_id="r1", **kw) == {
        "request_id": "r1", "step_id": "h"}
    finished = await wait_status(core, run.trace_id, "succeeded", "failed")
    assert finished.status == "succeeded" and finished.owner_process is None
    evs = await events(core, run.trace_id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert [e.kind for e in evs][3:] == ["run_resumed", "reply_received", "step_finished", "run_finished"]
    assert evs[-1].data["output"] == "yes"


async def test_a_run_claimed_too_often_ends_interrupted(core):
    user = await auth.register(core, user_name="orphan", password="password-123")
    run = await orphan(core, user.id, attempts=core.settings.run_max_attempts)
    await core.engine.start()
    run = await wait_status(core, run.trace_id, "interrupted")
    last = (await events(core, run.trace_id))[-1]
    assert last.kind == "run_failed" and last.data["status"] == "interrupted"
    assert "interrupted 3 times" in last.data["reason"]
    assert (await steps_of(core, run.trace_id))["h"].status == "interrupted"


async def wait_for_kind(core, trace_id: str, kind: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.kind == kind for e in await events(core, trace_id)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {kind} event in {[e.kind for e in await events(core, trace_id)]}")
