"""A burst of queued runs (a minute's schedule fires) is claimed in one statement and
started in one transaction (`Engine.submit_many` → `Claims.take` → `RunStore.start_many`),
on both stores: each run keeps a claim token of its own, fresh runs store `run_started`
together, runs that are not fresh (handed back with events, a retry's reused steps) begin
in their own task as before, a claim lost meanwhile writes nothing, and `max_runs` holds."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.db.models import RunEvent, RunStep, WorkflowRun
from orchestra.engine.store.events import Fenced
from orchestra.services import auth, templates
from orchestra.services.trigger_runs import new_run
from tests.engine.test_engine import events, kinds, wait_status

HUMAN = [{"id": "h", "agent": {"human": True}, "prompt": "Your name?"}]


@pytest.fixture
def database_url(both_stores):
    return both_stores


async def queued(core, count: int, *, steps=HUMAN) -> list[str]:
    """`count` queued runs of one template, stored as the fire loop stores them (nobody
    told the engine)."""
    user = await auth.register(core, user_name=f"u{time.monotonic_ns()}", password="password-123")
    template = await templates.create_template(core, owner_id=user.id, is_admin=False,
                                        name=f"t{time.monotonic_ns()}", steps=steps)
    stored = await core.engine.store.create([
        new_run(owner_id=user.id, template=template, input_text=f"in {i}", input_value=None, trigger=None)
        for i in range(count)])
    return [run.trace_id for run in stored]


async def rows(core, ids: list[str]) -> dict[str, WorkflowRun]:
    return {r.trace_id: r for r in await core.db.list(WorkflowRun.select().where(WorkflowRun.trace_id.in_(ids)))}


async def test_a_burst_is_claimed_and_started_together_each_with_a_token_of_its_own(core):
    ids = await queued(core, 6)
    await core.engine.submit_many(ids)
    for trace_id in ids:
        await wait_status(core, trace_id, "waiting_reply")
    stored = await rows(core, ids)
    tokens = {r.owner_process for r in stored.values()}
    assert len(tokens) == 6 and all(t.startswith(core.engine.store.me + "#") for t in tokens)
    assert all(r.attempts == 1 and r.started_at is not None for r in stored.values())
    for i, trace_id in enumerate(ids):
        live = core.engine.runs[trace_id]
        assert live.begun  # its run_started was stored with the burst's, not by its task
        evs = await events(core, trace_id)
        assert kinds(evs) == ["run_started", "step_started", "reply_requested"]
        assert [e.seq for e in evs] == [1, 2, 3]
        assert evs[0].data == {"trace_id": trace_id, "seq": 1, "ts": evs[0].data["ts"],
                               "status": "running", "input": f"in {i}", "steps": ["h"]}


async def test_runs_that_are_not_fresh_begin_in_their_own_task(core):
    """In one burst: a fresh run, a run handed back after it started (it resumes), and
    a retry whose first step is reused (its task stores `run_started` and the reused
    step's `step_finished`, as a run started alone does)."""
    fresh, handed_back, retry = await queued(core, 3, steps=[
        {"id": "a", "agent": {"human": True}, "prompt": "First?"},
        {"id": "b", "agent": {"human": True}, "prompt": "Second?", "depends_on": ["a"]}])
    await core.db.aexecute(RunEvent.insert(run=handed_back, seq=1, kind="run_started",
                                           data={"trace_id": handed_back, "seq": 1, "status": "running"}))
    await core.db.aexecute(WorkflowRun.update(attempts=1, status="running").where(WorkflowRun.trace_id == handed_back))
    await core.db.aexecute(RunStep.update(reused=True, status="succeeded", output="kept").where(
        (RunStep.run == retry) & (RunStep.step_id == "a")))
    await core.engine.submit_many([fresh, handed_back, retry])
    for trace_id in (fresh, handed_back, retry):
        await wait_status(core, trace_id, "waiting_reply")
    assert core.engine.runs[fresh].begun
    assert not core.engine.runs[handed_back].begun and not core.engine.runs[retry].begun
    assert kinds(await events(core, fresh)) == ["run_started", "step_started", "reply_requested"]
    assert kinds(await events(core, handed_back)) == ["run_started", "run_resumed", "step_started", "reply_requested"]
    evs = await events(core, retry)
    assert kinds(evs) == ["run_started", "step_finished", "step_started", "reply_requested"]
    assert evs[1].data["reused"] is True and evs[1].data["output"] == "kept"
    assert evs[2].data["step_id"] == "b"


async def test_a_start_whose_claim_was_lost_writes_nothing(core):
    """`start_many` checks every claim in its transaction: one lost meanwhile (another
    process took the run) refuses the whole start, and nothing of it is stored."""
    await core.engine.start()
    store = core.engine.store
    ids = await queued(core, 2)
    claimed = await store.claim_many(ids)
    assert [r.trace_id for r in claimed] == ids
    for run in claimed:
        store.hold(run.trace_id, run.owner_process)
    await core.db.aexecute(WorkflowRun.update(owner_process="elsewhere:1:abc#1", lease_until=time.time() + 60)
                           .where(WorkflowRun.trace_id == ids[1]))
    with pytest.raises(Fenced):
        await store.start_many({t: {"status": "running", "input": "", "steps": ["h"]} for t in ids})
    await store.release()
    assert await core.db.list(RunEvent.select().where(RunEvent.run.in_(ids))) == []
    assert {r.status for r in (await rows(core, ids)).values()} == {"queued"}
    for trace_id in ids:
        store.let_go(trace_id)


async def test_a_lost_claim_in_a_burst_leaves_the_others_to_start(core):
    """The burst's start refused (a claim lost after the claim statement): every run
    begins in its own task instead; the one whose claim was taken writes nothing."""
    ids = await queued(core, 3)
    store = core.engine.store
    claim_many = store.claim_many

    async def claim_then_lose_one(trace_ids, **kw):
        runs = await claim_many(trace_ids, **kw)
        await core.db.aexecute(WorkflowRun.update(owner_process="elsewhere:1:abc#1", lease_until=time.time() + 60)
                               .where(WorkflowRun.trace_id == ids[0]))
        return runs

    store.claim_many = claim_then_lose_one
    try:
        await core.engine.submit_many(ids)
    finally:
        store.claim_many = claim_many
    for trace_id in ids[1:]:
        await wait_status(core, trace_id, "waiting_reply")
        assert not core.engine.runs[trace_id].begun
        assert kinds(await events(core, trace_id)) == ["run_started", "step_started", "reply_requested"]
    deadline = time.monotonic() + 5
    while core.engine.is_live(ids[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not core.engine.is_live(ids[0])
    assert await events(core, ids[0]) == []
    assert (await rows(core, ids[:1]))[ids[0]].owner_process == "elsewhere:1:abc#1"


async def test_claim_many_takes_only_runs_nobody_holds(core):
    await core.engine.start()
    ids = await queued(core, 3)
    held_elsewhere = "elsewhere:1:abc#7"
    await core.db.aexecute(WorkflowRun.update(owner_process=held_elsewhere, lease_until=time.time() + 60, attempts=1)
                           .where(WorkflowRun.trace_id == ids[1]))
    await core.db.aexecute(WorkflowRun.update(owner_process="dead:1:abc#1", lease_until=time.time() - 1, attempts=1)
                           .where(WorkflowRun.trace_id == ids[2]))
    claimed = await core.engine.store.claim_many(ids)
    await core.engine.store.release()
    assert [r.trace_id for r in claimed] == [ids[0], ids[2]]
    stored = await rows(core, ids)
    assert stored[ids[1]].owner_process == held_elsewhere
    assert stored[ids[0]].attempts == 1 and stored[ids[2]].attempts == 2  # the dead owner's: a crash
    assert stored[ids[0]].owner_process != stored[ids[2]].owner_process


async def test_a_burst_larger_than_the_room_takes_what_fits_and_wakes_for_the_rest(core):
    ids = await queued(core, 5)
    core.engine.runs.max_runs = 3
    sent: list[str] = []
    await core.engine.start()
    core.signals.on("control", sent.append)
    await core.engine.submit_many(ids)
    await asyncio.sleep(0)  # the in-process bus delivers on the next turn
    assert sorted(t for t in ids if core.engine.is_live(t)) == sorted(ids[:3])
    assert sent == [f"wake:{ids[3]}"]
    stored = await rows(core, ids)
    assert all(stored[t].owner_process is None and stored[t].status == "queued" for t in ids[3:])
    # room freed: the claim loop takes the rest, never more than max_runs at once
    for trace_id in ids[:3]:
        await core.engine.cancel(trace_id)
    for trace_id in ids[3:]:
        await wait_status(core, trace_id, "waiting_reply")
    assert len(core.engine.runs) <= 3
