"""The workflow language at run time (SPEC §7): the engine against the real fake model and
a real store, through the services the HTTP routes call."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.core import build_engine
from orchestra.db.models import WorkflowRun
from orchestra.errors import ConflictError, ValidationError
from orchestra.services import runs, templates
from tests.engine.test_engine import events, kinds, setup_agent, steps_of, wait_status, worker_step


@pytest.fixture
def database_url(both_stores: str) -> str:
    """Every rule on SQLite and on PostgreSQL (skipped without ORCHESTRA_TEST_POSTGRES_URL)."""
    return both_stores


VERDICT = {"type": "object", "required": ["approved"],
           "properties": {"approved": {"type": "boolean"}, "notes": {"type": "string"}}}


async def start(core, who, steps, *, input="hello", **options):
    template = await templates.create_template(
        core, owner_id=who["user_id"], is_admin=False, name=f"t{time.monotonic_ns()}", steps=steps,
        options=options,
    )
    run = await runs.start_run(core, user_id=who["user_id"], is_admin=False,
                             template_id=template.id, input=input)
    return run.trace_id


def human(sid, prompt="ok?", depends_on=(), **extra):
    return {"id": sid, "agent": {"human": True}, "prompt": prompt, "depends_on": list(depends_on), **extra}


def data_of(evs, kind, step_id=None):
    return [{**e.data, "step_id": e.data.get("step_id", e.step_id if hasattr(e, "step_id") else None)}
            for e in evs if e.kind == kind and (step_id is None or _step_of(e) == step_id)]


def _step_of(event):
    return event.data.get("step_id") or getattr(event, "step_id", None)


async def test_json_outputs_flow_field_by_field_into_when_and_prompts(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_json({"approved": False, "notes": "too short"})
    fake_llm.script_text("rewritten")
    steps = [
        {**worker_step(who, "review", "Review {{ input.text }}"), "output_schema": VERDICT},
        {**worker_step(who, "publish", "Publish", ["review"]), "when": "steps.review.output.approved"},
        {**worker_step(who, "fix", "Fix: {{ steps.review.output.notes }} ({{ steps.review.output }})",
                       ["review"]), "when": "!steps.review.output.approved"},
        worker_step(who, "after", "done", ["publish"]),  # every dependency skipped
        worker_step(who, "end", "{{ steps.publish.status }}/{{ steps.fix.output }}", ["publish", "fix"]),
    ]
    fake_llm.script_text("the end")
    trace_id = await start(core, who, steps, input={"text": "draft"},
                           input_schema={"type": "object"}, output='{"fix": steps.fix.output}')
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    evs = await events(core, trace_id)
    assert data_of(evs, "step_finished", "review")[0]["output"] == {"approved": False, "notes": "too short"}
    assert [d["reason"] for d in data_of(evs, "step_skipped")] == ["when", "dependencies"]
    assert [d["step_id"] for d in data_of(evs, "step_skipped")] == ["publish", "after"]
    sent = [r["messages"][-1]["content"] for r in fake_llm.chat_requests]
    assert sent == ["Review draft", 'Fix: too short ({"approved":false,"notes":"too short"})',
                    "skipped/rewritten"]
    assert fake_llm.chat_requests[0]["response_format"]["json_schema"]["schema"] == VERDICT
    assert data_of(evs, "run_finished")[0]["output"] == {"fix": "rewritten"}
    rows = await steps_of(core, trace_id)
    assert rows["review"].output_value == {"approved": False, "notes": "too short"}
    assert (rows["publish"].status, rows["after"].status) == ("skipped", "skipped")
    detail = await runs.run_detail(core, await WorkflowRun.aget(WorkflowRun.trace_id == trace_id))
    review = detail["steps"][0]
    assert (review["path"], review["attempt"], review["reused"], review["output"]) == (
        "review", 1, False, {"approved": False, "notes": "too short"})
    assert detail["input"] == {"text": "draft"}


async def test_a_wrong_structured_answer_is_repaired_then_fails_with_the_violations(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_json({"approved": "yes"})
    fake_llm.script_json({"approved": True})
    trace_id = await start(core, who, [{**worker_step(who, "r"), "output_schema": VERDICT}])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded"
    repair = fake_llm.chat_requests[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": '{"approved":"yes"}'}
    assert 'output.approved: "yes" is not of type "boolean"' in repair[-1]["content"]

    fake_llm.reset()
    for _ in range(3):  # the answer and ORCHESTRA_SCHEMA_REPAIRS (2) repairs, all wrong
        fake_llm.script_text("not json")
    trace_id = await start(core, who, [{**worker_step(who, "r"), "output_schema": VERDICT}])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "failed" and len(fake_llm.chat_requests) == 3
    assert "did not match output_schema after 2 repair rounds" in run.error and "is not JSON" in run.error


async def test_expression_failing_at_run_time_fails_its_step_naming_it(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_json({"approved": True})
    steps = [{**worker_step(who, "r"), "output_schema": VERDICT},
             {**worker_step(who, "n", "x", ["r"]), "when": "steps.r.output.notes == 'x'"}]
    trace_id = await start(core, who, steps)
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "failed"
    assert "expression `steps.r.output.notes == 'x'`" in run.error and "notes" in run.error


async def test_retry_with_backoff_marks_later_attempts(core, fake_llm):
    who = await setup_agent(core, fake_llm, tools=())
    fake_llm.script_error(400, "bad request one")
    fake_llm.script_text("second time lucky")
    steps = [{**worker_step(who, "flaky"), "retry": {"max_attempts": 3, "backoff_seconds": 0.05}}]
    trace_id = await start(core, who, steps)
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded"
    evs = await events(core, trace_id)
    retrying = data_of(evs, "step_retrying")
    assert len(retrying) == 1 and retrying[0]["attempt"] == 1 and "bad request one" in retrying[0]["error"]
    assert 0.0375 <= retrying[0]["delay_seconds"] <= 0.0625
    started = data_of(evs, "step_started")
    assert "attempt" not in started[0] and started[1]["attempt"] == 2
    assert data_of(evs, "step_finished")[0]["attempt"] == 2
    assert all(d.get("attempt") == 2 for d in data_of(evs, "token"))
    assert (await steps_of(core, trace_id))["flaky"].attempt == 2


async def test_timeout_fails_an_agent_step_and_on_error_continue_goes_on(core, fake_llm):
    who = await setup_agent(core, fake_llm, tools=())
    fake_llm.script_text("too late", initial_delay=3)
    steps = [{**worker_step(who, "slow"), "timeout_seconds": 1, "on_error": "continue"},
             worker_step(who, "next", "status {{ steps.slow.status }} output {{ steps.slow.output }}", ["slow"])]
    fake_llm.script_text("carried on")
    trace_id = await start(core, who, steps)
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=15)
    assert run.status == "succeeded"
    evs = await events(core, trace_id)
    assert data_of(evs, "step_failed", "slow")[0]["error"] == "timed out after 1 s"
    rows = await steps_of(core, trace_id)
    assert rows["slow"].status == "failed" and rows["slow"].output is None
    assert fake_llm.chat_requests[-1]["messages"][-1]["content"] == "status failed output null"


async def test_human_reply_is_validated_and_a_timeout_takes_the_default(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    schema = {"type": "object", "required": ["approved"], "properties": {"approved": {"type": "boolean"}}}
    trace_id = await start(core, who, [human("approve", output_schema=schema)])
    kw = {"user_id": who["user_id"], "is_admin": False, "trace_id": trace_id}
    await wait_status(core, trace_id, "waiting_reply")
    evs = await events(core, trace_id)
    assert data_of(evs, "reply_requested")[0]["schema"] == schema
    with pytest.raises(ValidationError) as caught:
        await runs.reply(core, **kw, content={"approved": "yes"})
    assert caught.value.detail == [{"field": "content.approved", "problem": '"yes" is not of type "boolean"'}]
    with pytest.raises(ValidationError):
        await runs.reply(core, **kw, content="yes")
    run = await runs.get_run(core, **kw)
    assert len(await runs.pending_replies(core, run)) == 1  # still open
    await runs.reply(core, **kw, content={"approved": True})
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert (await steps_of(core, trace_id))["approve"].output_value == {"approved": True}

    steps = [human("h", timeout_seconds=1, default="nobody answered")]
    trace_id = await start(core, who, steps)
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=15)
    assert run.status == "succeeded"
    evs = await events(core, trace_id)
    asked = data_of(evs, "reply_requested")[0]
    assert data_of(evs, "reply_timed_out")[0]["request_id"] == asked["request_id"]
    assert data_of(evs, "step_finished")[0]["output"] == "nobody answered"
    with pytest.raises(ConflictError):
        await runs.reply(core, user_id=who["user_id"], is_admin=False, trace_id=trace_id, content="late")

    trace_id = await start(core, who, [human("h", timeout_seconds=1)])
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=15)
    assert run.status == "failed" and "timed out after 1 s" in run.error


async def test_limits_end_the_run_naming_the_limit(core, fake_llm):
    who = await setup_agent(core, fake_llm, tools=())
    fake_llm.script_error(400, "no")
    fake_llm.script_error(400, "no")
    steps = [{**worker_step(who, "a"), "retry": {"max_attempts": 5}}]
    trace_id = await start(core, who, steps, limits={"max_steps": 2})
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "failed" and "limit of 2 step executions (limits.max_steps)" in run.error
    assert len(fake_llm.chat_requests) == 2  # the third execution never started

    trace_id = await start(core, who, [human("h")], limits={"deadline_seconds": 1})
    run = await wait_status(core, trace_id, "succeeded", "failed", timeout=15)
    assert run.status == "failed" and "deadline of 1 s (limits.deadline_seconds)" in run.error
    evs = await events(core, trace_id)
    assert kinds(evs)[-1] == "run_failed" and data_of(evs, "run_failed")[0]["status"] == "failed"


async def test_retry_of_a_failed_run_reuses_what_succeeded(core, fake_llm):
    who = await setup_agent(core, fake_llm, tools=())
    fake_llm.script_text("first output")
    fake_llm.script_error(400, "broken")
    steps = [worker_step(who, "a"), worker_step(who, "b", "use {{steps.a.output}}", ["a"])]
    trace_id = await start(core, who, steps)
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "failed"
    kw = {"user_id": who["user_id"], "is_admin": False}
    fake_llm.script_text("fixed")
    again = await runs.retry_run(core, **kw, trace_id=trace_id)
    assert again.retry_of == trace_id
    run = await wait_status(core, again.trace_id, "succeeded", "failed")
    assert run.status == "succeeded"
    assert len(fake_llm.chat_requests) == 3  # step a was never called again
    assert fake_llm.chat_requests[-1]["messages"][-1]["content"] == "use first output"
    rows = await steps_of(core, again.trace_id)
    assert (rows["a"].reused, rows["a"].output, rows["b"].reused) == (True, "first output", False)
    source = await steps_of(core, trace_id)
    assert source["a"].usage and source["a"].usage["completion_tokens"] > 0
    assert rows["a"].usage is None  # its tokens were spent by the source run: never counted twice
    assert rows["b"].usage and rows["b"].usage["completion_tokens"] > 0
    evs = await events(core, again.trace_id)
    reused = [e for e in evs if e.kind == "step_finished" and e.data.get("reused")]
    assert len(reused) == 1 and reused[0].data["output"] == "first output"
    assert "step_started" not in [e.kind for e in evs if e.data.get("step_id") == "a"]
    with pytest.raises(ConflictError):
        await runs.retry_run(core, **kw, trace_id=again.trace_id)  # it succeeded
    fake_llm.script_text("a again")
    fake_llm.script_text("b again")
    third = await runs.retry_run(core, **kw, trace_id=trace_id, from_step="a")
    await wait_status(core, third.trace_id, "succeeded")
    assert len(fake_llm.chat_requests) == 5
    with pytest.raises(ValidationError):
        await runs.retry_run(core, **kw, trace_id=trace_id, from_step="zz")


async def test_on_tool_error_fail_fails_the_step_at_the_first_tool_error(core, fake_llm):
    """Issue 29, item 8: `tools: {on_tool_error: "fail"}` ends the step at a tool's error
    (by default the model reads the error and goes on, as before)."""
    who = await setup_agent(core, fake_llm)
    fake_llm.script_tool_call("calculator", {"expression": "1 / 0"})  # a tool error
    fake_llm.script_text("went on")
    lenient = await start(core, who, [worker_step(who)])
    run = await wait_status(core, lenient, "succeeded", "failed")
    assert run.status == "succeeded"
    assert data_of(await events(core, lenient), "tool_result")[0]["error"]

    fake_llm.script_tool_call("calculator", {"expression": "1 / 0"})
    strict_step = {**worker_step(who), "tools": {"on_tool_error": "fail"}}
    strict = await start(core, who, [strict_step])
    run = await wait_status(core, strict, "succeeded", "failed")
    assert run.status == "failed"
    (failed,) = data_of(await events(core, strict), "step_failed")
    assert "The tool calculator failed (tools.on_tool_error is 'fail')" in failed["error"]
    assert len(fake_llm.chat_requests) == 3  # the strict step never asked the model again
    stored = (await templates.get_template(core, user_id=who["user_id"], is_admin=False,
                                    template_id=(await WorkflowRun.aget_by_id(strict)).template_id)).steps
    assert stored[0]["tools"] == {"on_tool_error": "fail"}


async def test_a_null_structured_output_reads_null_after_a_take_over(core, fake_llm):
    """Issue 24: a step whose JSON output is null read as "" once another engine resumed
    the run (the engine's step_output differed from the service's), so `steps.a.output ==
    null` turned false after a restart and skipped the step it guarded."""
    who = await setup_agent(core, fake_llm)
    steps = [human("a", output_schema={"type": "null"}),
             human("c", depends_on=["a"]),
             human("b", prompt="a was {{ steps.a.output }}", depends_on=["c"], when="steps.a.output == null")]
    trace_id = await start(core, who, steps)
    kw = {"user_id": who["user_id"], "is_admin": False, "trace_id": trace_id}
    await wait_status(core, trace_id, "waiting_reply")
    await runs.reply(core, **kw, content=None)
    await wait_for_question(core, trace_id, "c")
    await core.engine.stop(grace=0.2)  # handed back: the next engine resumes from the rows
    core.engine = build_engine(core)  # the next process's engine
    await core.engine.start()
    await wait_for_question(core, trace_id, "c")
    await runs.reply(core, **kw, content="go")
    await wait_for_question(core, trace_id, "b")
    asked = [e.data for e in await events(core, trace_id) if e.kind == "reply_requested"]
    assert asked[-1]["step_id"] == "b" and asked[-1]["prompt"] == "a was null"


async def wait_for_question(core, trace_id: str, step_id: str, timeout: float = 10.0) -> None:
    """Until the run's newest open question is `step_id`'s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = (await runs.run_detail(core, await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)))["pending_replies"]
        if pending and pending[-1]["step_id"] == step_id:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{step_id} never asked")


async def test_on_tool_error_as_a_step_field_fails_the_step(core, fake_llm):
    """Issue 39, point 8: `on_tool_error: "fail"` beside `retry` and `on_error` (SPEC §7)
    does what its alias `tools.on_tool_error` does, and the error names the field."""
    who = await setup_agent(core, fake_llm)
    fake_llm.script_tool_call("calculator", {"expression": "1 / 0"})
    strict = await start(core, who, [{**worker_step(who), "on_tool_error": "fail"}])
    run = await wait_status(core, strict, "succeeded", "failed")
    assert run.status == "failed"
    (failed,) = data_of(await events(core, strict), "step_failed")
    assert "The tool calculator failed (on_tool_error is 'fail')" in failed["error"]
    assert len(fake_llm.chat_requests) == 1
