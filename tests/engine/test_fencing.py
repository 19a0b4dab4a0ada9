"""Fencing (SPEC §6): every write of a run's owner is conditioned on its claim, so an
owner that lost the claim is refused by the store and its task stops, writing nothing."""

from __future__ import annotations

import asyncio
import time

from orchestra.db.models import WorkflowRun
from tests.engine.test_engine import events, kinds, setup_agent, start, steps_of, wait_status


async def wait_kind(core, trace_id: str, kind: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if kind in kinds(await events(core, trace_id)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {kind} in {kinds(await events(core, trace_id))}")


async def test_an_owner_whose_claim_was_taken_writes_nothing_more(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    trace_id = await start(core, who, [
        {"id": "h", "agent": {"human": True}, "prompt": "Name?"},
        {"id": "after", "agent": {"human": True}, "prompt": "More?", "depends_on": ["h"]},
    ])
    await wait_kind(core, trace_id, "reply_requested")
    live = core.engine.runs[trace_id]
    # Another process claimed the run (as after this one's lease ran out).
    other = "elsewhere:1:abcdef#1"
    await core.db.aexecute(WorkflowRun.update(owner_process=other, lease_until=time.time() + 60)
                           .where(WorkflowRun.trace_id == trace_id))
    before = kinds(await events(core, trace_id))
    # The answer reaches the stale owner, whose step would now finish and go on.
    await core.engine.reply(trace_id, content="Ada", request_id=None)
    await asyncio.wait_for(live.task, 10)
    after = await events(core, trace_id)
    assert kinds(after) == before + ["reply_received"]  # the reply is any process's write
    run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert run.owner_process == other and run.status in ("running", "waiting_reply")
    assert run.finished_at is None and run.error is None
    assert (await steps_of(core, trace_id))["after"].status == "pending"
    assert not core.engine.is_live(trace_id)


async def test_a_claim_is_a_token_of_its_own_and_every_write_carries_it(core, fake_llm):
    who = await setup_agent(core, fake_llm)
    fake_llm.script_text("done")
    trace_id = await start(core, who, [{"id": "a", "agent": {"worker": who["worker_id"]},
                                        "prompt": "{{input}}"}])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded" and run.owner_process is None and run.attempts == 1
    me = core.engine.store.ownership.me
    first, second = core.engine.store.ownership.new_token(), core.engine.store.ownership.new_token()
    assert first.startswith(me + "#") and second.startswith(me + "#") and first != second
