"""A run's ordered background writes on both stores: every event once, in order, each
step's rows and events consistent, the last token stored with `step_finished`; and a
stop that meets a run handing itself back while its last writes are slow."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.db.models import RunEvent, RunStep, WorkflowRun
from tests.engine.test_engine import setup_agent, start
from tests.fakes.fake_llm import FakeLLM


@pytest.fixture
def database_url(both_stores):
    return both_stores


async def test_a_run_stores_every_event_once_in_order_with_its_step_rows(core, fake_llm: FakeLLM):
    who = await setup_agent(core, fake_llm)
    core.engine.agent_steps.token_interval = 5.0  # no timer flush: a step's text is one token event
    fake_llm.script_text("alpha beta gamma", chunks=3)
    fake_llm.script_tool_call("calculator", {"expression": "6*7"})
    fake_llm.script_text("It is 42.")
    fake_llm.script_text("left")
    fake_llm.script_text("right")
    wid = who["worker_id"]
    steps = [
        {"id": "a", "agent": {"worker": wid}, "prompt": "{{input}}"},
        {"id": "b", "agent": {"worker": wid}, "prompt": "{{steps.a.output}}", "depends_on": ["a"]},
        {"id": "c", "agent": {"worker": wid}, "prompt": "c", "depends_on": ["b"]},
        {"id": "d", "agent": {"worker": wid}, "prompt": "d", "depends_on": ["b"]},
    ]
    trace_id = await start(core, who, steps)
    live = core.engine.runs.get(trace_id)  # None: already gone
    if live is not None:
        await live.task  # the run ends only once its writes are stored

    run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert run.status == "succeeded"
    rows = await core.db.list(RunStep.select().where(RunStep.run == trace_id).order_by(RunStep.step_id))
    assert [(r.step_id, r.status) for r in rows] == [(s, "succeeded") for s in "abcd"]
    assert rows[0].output == "alpha beta gamma" and rows[1].output == "It is 42."
    assert all(r.started_at is not None and r.finished_at >= r.started_at for r in rows)

    stored = await core.db.list(RunEvent.select().where(RunEvent.run == trace_id).order_by(RunEvent.seq))
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert [e.data["seq"] for e in stored] == [e.seq for e in stored]
    assert stored[0].kind == "run_started" and stored[-1].kind == "run_finished"
    for sid in "abcd":
        kinds = [e.kind for e in stored if e.data.get("step_id") == sid]
        assert kinds[0] == "step_started" and kinds[-1] == "step_finished", (sid, kinds)
    text_a = "".join(e.data["text"] for e in stored if e.kind == "token" and e.data["step_id"] == "a")
    assert text_a == "alpha beta gamma"
    b_kinds = [e.kind for e in stored if e.data.get("step_id") == "b"]
    assert b_kinds.index("tool_call") < b_kinds.index("tool_result") < b_kinds.index("step_finished")
    finished_a = next(e for e in stored if e.kind == "step_finished" and e.data["step_id"] == "a")
    last_token_a = stored[finished_a.seq - 2]
    assert last_token_a.kind == "token" and last_token_a.data["ts"] == finished_a.data["ts"]  # one INSERT


SHORT_LEASE = {"run_lease_seconds": 1.5}  # renewed every 0.5 s: the lease loop is busy


async def _stop_while_step_a_ends_slowly(core, fake_llm: FakeLLM, *, write_delay: float,
                                         grace: float) -> tuple[str, float]:
    """A two-step run whose step `a` (1.5 s) ends during the stop's grace: the run hands
    itself back (no step may start then), and the hand-back waits for `a`'s end to be
    stored, which takes `write_delay` (a busy store). The stop comes once the lease loop
    has renewed the lease, ~1 s before `a` ends: a grace of 2.5 s leaves a busy machine
    room. Returns the run and how long the stop took."""
    who = await setup_agent(core, fake_llm)
    fake_llm.script_text(" ".join(f"w{n}" for n in range(10)), chunks=10, delay=0.15)
    wid = who["worker_id"]
    engine = core.engine
    trace_id = await start(core, who, [
        {"id": "a", "agent": {"worker": wid}, "prompt": "{{input}}"},
        {"id": "b", "agent": {"worker": wid}, "prompt": "b", "depends_on": ["a"]},
    ])
    live = engine.runs[trace_id]
    claimed_at = live.renewed_at
    deadline = time.monotonic() + 10
    while live.renewed_at == claimed_at:  # renewed once: the lease loop has its connection
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    store_instances = engine.store.store_instances

    async def slow(*args, **kwargs):
        if engine.stopping:
            await asyncio.sleep(write_delay)
        return await store_instances(*args, **kwargs)

    engine.store.store_instances = slow
    began = time.monotonic()
    await engine.stop(grace=grace)
    took = time.monotonic() - began
    await asyncio.wait({live.task}, timeout=write_delay + 5)
    return trace_id, took


@pytest.mark.parametrize("settings_overrides", [SHORT_LEASE])
async def test_a_stop_does_not_cut_short_a_hand_back_under_way(core, fake_llm: FakeLLM):
    """The grace ends while the run is handing itself back: the stop lets that finish
    (cancelling it left the run owned until its lease ran out: its next claim counted
    as an attempt)."""
    trace_id, _ = await _stop_while_step_a_ends_slowly(core, fake_llm, write_delay=2.5, grace=2.5)
    run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert (run.owner_process, run.lease_until, run.attempts) == (None, None, 1)
    assert [s.status for s in await core.db.list(RunStep.select().where(RunStep.run == trace_id)
                                                 .order_by(RunStep.step_id))] == ["succeeded", "pending"]


@pytest.mark.parametrize("settings_overrides", [SHORT_LEASE])
async def test_runs_still_handing_back_after_the_grace_are_handed_back_at_once(core, fake_llm: FakeLLM):
    """A hand-back still waiting for its writes 2 s after the grace: the stop gives the
    run back in bulk, in time (on PostgreSQL on the lease connection, which the lease
    loop keeps until it ends: the bulk hand-back used to wait for it, and time out)."""
    trace_id, took = await _stop_while_step_a_ends_slowly(core, fake_llm, write_delay=6.0, grace=2.5)
    run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert (run.owner_process, run.lease_until, run.attempts) == (None, None, 1)
    assert took < 2.5 + 5  # SPEC §6: a stopping process exits within its grace plus 5 s
