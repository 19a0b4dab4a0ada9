"""Questions of a restarted step (SPEC §6): the same question keeps its request_id and
an answer stored meanwhile is used; a question not asked again is withdrawn
(`reply_withdrawn`) once the restarted step asks a different one, and a reply to it is
409."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import WorkflowRun
from orchestra.engine.model import StopReason
from orchestra.errors import ConflictError
from tests.engine.test_engine import events, kinds, setup_agent, start, wait_status
from tests.engine.test_fencing import wait_kind


async def crash_and_resume(core, trace_id: str) -> None:
    """As if the owner died: its task stops writing, its lease runs out, a claim resumes it."""
    live = core.engine.runs[trace_id]
    live.writes.abandon()
    core.engine.runs.stop(live, StopReason.LOST)
    await asyncio.wait_for(live.task, 10)
    await core.db.aexecute(WorkflowRun.update(lease_until=1.0).where(WorkflowRun.trace_id == trace_id))
    core.engine.wake()


async def test_a_reworded_question_withdraws_the_earlier_one(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_tool_call("ask_user", {"question": "Which colour?"})
    fake_llm.script_tool_call("ask_user", {"question": "Which colour would you like?"})
    fake_llm.script_text("Blue it is.")
    trace_id = await start(core, who, [{"id": "w", "agent": {"worker": who["worker_id"]},
                                        "prompt": "{{input}}"}])
    await wait_kind(core, trace_id, "reply_requested")
    old = next(e.data["request_id"] for e in await events(core, trace_id)
               if e.kind == "reply_requested")
    await crash_and_resume(core, trace_id)
    deadline = asyncio.get_running_loop().time() + 10
    while kinds(evs := await events(core, trace_id)).count("reply_requested") < 2:
        assert asyncio.get_running_loop().time() < deadline, kinds(evs)
        await asyncio.sleep(0.02)
    withdrawn = [e for e in evs if e.kind == "reply_withdrawn"]
    asked = [e.data["request_id"] for e in evs if e.kind == "reply_requested"]
    assert [e.data["request_id"] for e in withdrawn] == [old] and withdrawn[0].data["step_id"] == "w"
    assert len(asked) == 2 and asked[0] == old
    assert kinds(evs).index("reply_withdrawn") < len(evs) - 1  # before the new question
    with pytest.raises(ConflictError):
        await core.engine.reply(trace_id, content="red", request_id=old)
    assert [q["request_id"] for q in await core.engine.open_questions(trace_id)] == [asked[1]]
    await core.engine.reply(trace_id, content="blue", request_id=asked[1])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded"


async def test_the_same_question_keeps_its_request_id_and_uses_an_answer_given_meanwhile(
        core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_tool_call("ask_user", {"question": "Which colour?"})
    fake_llm.script_tool_call("ask_user", {"question": "Which colour?"})
    fake_llm.script_text("Blue it is.")
    trace_id = await start(core, who, [{"id": "w", "agent": {"worker": who["worker_id"]},
                                        "prompt": "{{input}}"}])
    await wait_kind(core, trace_id, "reply_requested")
    live = core.engine.runs[trace_id]
    live.writes.abandon()
    core.engine.runs.stop(live, StopReason.LOST)
    await asyncio.wait_for(live.task, 10)
    await core.engine.reply(trace_id, content="blue", request_id=None)  # nobody holds it now
    await core.db.aexecute(WorkflowRun.update(lease_until=1.0).where(WorkflowRun.trace_id == trace_id))
    core.engine.wake()
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded"
    evs = await events(core, trace_id)
    assert kinds(evs).count("reply_requested") == 1 and "reply_withdrawn" not in kinds(evs)
    tool_results = [m for m in fake_llm.chat_requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_results[-1]["content"] == "blue"
