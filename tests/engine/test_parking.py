"""Waiting runs hold no task (SPEC §15b, engine/parking.py): a run whose every call
waits for a reply or a child run is parked in the store — no live run, no asyncio task
in the engine — and a reply, its child's end, its timeout or a cancel resumes it
through the ordinary claim path, from its events, with nothing said twice. On both
stores; on PostgreSQL a reply taken by a second engine resumes a run the first parked."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.core import Core
from orchestra.db.models import RunEvent, WorkflowRun
from orchestra.engine.store.ownership import PARKED
from orchestra.services import auth, runs, templates
from tests.engine.test_engine import wait_status

WAITING = 100


@pytest.fixture
def settings_overrides():
    return {"max_runs": 4}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def user(core, name: str) -> str:
    return (await auth.register(core, user_name=name, password="password-123")).id


async def template(core, owner: str, name: str, steps: list, **options) -> str:
    return (await templates.create_template(core, owner_id=owner, is_admin=False, name=name, steps=steps,
                                            options=options or None)).id


async def start(core, owner: str, template_id: str, text: str = "x") -> str:
    return (await runs.start_run(core, user_id=owner, is_admin=False, template_id=template_id,
                                 input=text)).trace_id


def run_tasks() -> list[asyncio.Task]:
    """The tasks of runs (the claim and lease loops aside)."""
    return [task for task in asyncio.all_tasks()
            if task.get_name().startswith("run-") and task.get_name() not in ("run-claims", "run-leases")]


async def parked(core, trace_ids: list[str], timeout: float = 30) -> list[WorkflowRun]:
    """Wait until every one of these runs is parked in the store; their rows."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await core.db.list(WorkflowRun.select().where(WorkflowRun.trace_id.in_(trace_ids)))
        if all(row.owner_process == PARKED for row in rows) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)


async def kinds(core, trace_id: str) -> list[str]:
    return [kind for (kind,) in await core.db.list(RunEvent.select(RunEvent.kind).where(
        RunEvent.run == trace_id).order_by(RunEvent.seq).tuples())]


async def test_waiting_runs_hold_no_task_and_a_reply_finishes_each(core):
    alice, bob = await user(core, "alice"), await user(core, "bob")
    asks = await template(core, alice, "asks", [{"id": "q", "agent": {"human": True}, "prompt": "Name?"}])
    waiting = [await start(core, alice, asks) for _ in range(WAITING)]
    rows = await parked(core, waiting)
    assert [row.status for row in rows] == ["waiting_reply"] * WAITING
    assert {row.owner_process for row in rows} == {PARKED}
    await asyncio.sleep(0.2)
    assert len(core.engine.runs) == 0 and run_tasks() == []  # nothing held for them here

    # another user's run starts at once and finishes (ORCHESTRA_MAX_RUNS is 4)
    quick = await template(core, bob, "quick", [{"id": "c", "code": {"source": "'done'"}}])
    began = time.monotonic()
    theirs = await start(core, bob, quick)
    assert (await wait_status(core, theirs, "succeeded", "failed", timeout=10)).status == "succeeded"
    assert time.monotonic() - began < 5

    for n, trace_id in enumerate(waiting[:3]):
        await runs.reply(core, user_id=alice, is_admin=False, trace_id=trace_id, content=f"name {n}",
                         request_id=None)
    for n, trace_id in enumerate(waiting[:3]):
        done = await wait_status(core, trace_id, "succeeded", "failed", timeout=10)
        assert done.status == "succeeded" and done.attempts == 1 and done.owner_process is None
        assert (await runs.run_detail(core, done))["output"] == f"name {n}"
        # resumed from its events with nothing said twice: no take-over, one question
        assert await kinds(core, trace_id) == ["run_started", "step_started", "reply_requested",
                                               "reply_received", "step_finished", "run_finished"]
    rest = await core.db.list(WorkflowRun.select().where(WorkflowRun.trace_id.in_(waiting[3:])))
    assert {(row.status, row.owner_process) for row in rest} == {("waiting_reply", PARKED)}


async def test_a_parked_parent_resumes_when_its_child_ends(core):
    owner = await user(core, "alice")
    await template(core, owner, "ask", [{"id": "q", "agent": {"human": True}, "prompt": "Approve {{input}}?"}])
    top = await template(core, owner, "top", [
        {"id": "sub", "workflow": {"template": "ask", "input": "input"}},
        {"id": "after", "code": {"source": "steps['sub']['output'] + '!'"}, "depends_on": ["sub"]}])
    trace_id = await start(core, owner, top, "the plan")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the child's question shown on the parent, both parked
        asked = [e.data for e in await core.db.list(RunEvent.select().where(
            (RunEvent.run == trace_id) & (RunEvent.kind == "reply_requested")))]
        kids = await core.db.list(WorkflowRun.select().where(WorkflowRun.parent_trace_id == trace_id))
        both = await parked(core, [trace_id, *(kid.trace_id for kid in kids)], timeout=0)
        if asked and kids and all(row.owner_process == PARKED for row in both):
            break
        await asyncio.sleep(0.05)
    assert asked and asked[0]["child_trace_id"] == kids[0].trace_id, asked
    assert len(core.engine.runs) == 0 and run_tasks() == []
    await runs.reply(core, user_id=owner, is_admin=False, trace_id=kids[0].trace_id, content="yes",
                     request_id=asked[0]["request_id"])
    done = await wait_status(core, trace_id, "succeeded", "failed", timeout=10)
    assert done.status == "succeeded", done.error
    assert (await runs.run_detail(core, done))["output"] == "yes!"
    seen = await kinds(core, trace_id)
    assert "run_resumed" not in seen
    assert seen.count("child_started") == 1 and seen.count("reply_requested") == 1
    assert seen.count("reply_received") == 1 and seen.count("step_started") == 2  # sub, after


async def test_a_parked_runs_timeout_and_cancel_still_come(core):
    owner = await user(core, "alice")
    timed = await template(core, owner, "timed", [
        {"id": "q", "agent": {"human": True}, "prompt": "Quick?", "timeout_seconds": 1, "default": "late"}])
    asks = await template(core, owner, "asks", [{"id": "q", "agent": {"human": True}, "prompt": "Name?"}])
    late, cancelled = await start(core, owner, timed), await start(core, owner, asks)
    assert {r.owner_process for r in await parked(core, [late, cancelled])} == {PARKED}
    done = await wait_status(core, late, "succeeded", "failed", timeout=5)  # woken at its timeout
    assert done.status == "succeeded" and (await runs.run_detail(core, done))["output"] == "late"
    began = time.monotonic()
    await runs.cancel_run(core, user_id=owner, is_admin=False, trace_id=cancelled)
    assert (await wait_status(core, cancelled, "cancelled", timeout=2)).status == "cancelled"
    assert time.monotonic() - began < 2


async def test_a_reply_to_another_engine_resumes_the_run_there(core, database_url):
    if not core.is_postgres:
        pytest.skip("one SQLite store is served by one process")
    owner = await user(core, "alice")
    asks = await template(core, owner, "asks", [{"id": "q", "agent": {"human": True}, "prompt": "Name?"}])
    trace_id = await start(core, owner, asks)
    assert (await parked(core, [trace_id]))[0].owner_process == PARKED
    await core.engine.store.release()
    other = await Core.open(core.settings, migrate_schema=False)  # a second process's engine
    try:
        await other.engine.start()
        await runs.reply(other, user_id=owner, is_admin=False, trace_id=trace_id, content="bee",
                         request_id=None)
        await other.engine.store.release()
        done = await wait_status(core, trace_id, "succeeded", "failed", timeout=10)
        assert done.status == "succeeded" and (await runs.run_detail(core, done))["output"] == "bee"
        assert done.attempts == 1
        assert "run_resumed" not in await kinds(core, trace_id)
    finally:
        await other.close()
