"""Run slots between users (SPEC §15b): `ORCHESTRA_MAX_RUNS_PER_USER` keeps an owner's
extra runs `queued` (never refused) while another owner's run starts, and the claim
query takes queued runs in turns across owners, so one owner's backlog delays another's
run by one claim round at most. On both stores."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

from orchestra.db.models import WorkflowRun
from orchestra.services import auth, runs, templates
from orchestra.testing.fake_http import FakeHttp


@pytest.fixture(scope="module")
def target():
    with FakeHttp() as server:
        yield server


@pytest.fixture
def settings_overrides(target):
    return {"step_egress_allow": f"127.0.0.1:{target.port}", "max_runs": 10, "max_runs_per_user": 1}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def user(core, name: str) -> str:
    return (await auth.register(core, user_name=name, password="password-123")).id


async def slow_template(core, owner: str, target: FakeHttp, seconds: float) -> str:
    return (await templates.create_template(core, owner_id=owner, is_admin=False, name="slow", steps=[
        {"id": "wait", "http": {"method": "GET", "url": f"{target.url}/slow/{seconds}"}}])).id


async def test_an_owner_past_its_cap_waits_queued_while_another_runs(core, target):
    alice, bob = await user(core, "alice"), await user(core, "bob")
    alices = await slow_template(core, alice, target, 0.6)
    bobs = await slow_template(core, bob, target, 0.6)
    mine = [(await runs.start_run(core, user_id=alice, is_admin=False, template_id=alices, input="x")).trace_id
            for _ in range(3)]
    theirs = (await runs.start_run(core, user_id=bob, is_admin=False, template_id=bobs, input="x")).trace_id
    seen_running, bob_began_while_alice_queued = 0, False
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = {r.trace_id: r for r in await core.db.list(
            WorkflowRun.select().where(WorkflowRun.trace_id.in_([*mine, theirs])))}
        running = sum(1 for t in mine if rows[t].status == "running")
        seen_running = max(seen_running, running)
        if rows[theirs].status != "queued" and any(rows[t].status == "queued" for t in mine):
            bob_began_while_alice_queued = True
        if all(r.status == "succeeded" for r in rows.values()):
            break
        await asyncio.sleep(0.02)
    assert all(r.status == "succeeded" for r in rows.values()), {t: r.status for t, r in rows.items()}
    assert seen_running == 1  # never two of alice's at once; none refused, each ran once
    assert [rows[t].attempts for t in mine] == [1, 1, 1]
    assert bob_began_while_alice_queued


async def test_a_backlog_of_one_owner_does_not_hide_another_owners_run(core):
    alice, bob, carol = await user(core, "alice"), await user(core, "bob"), await user(core, "carol")
    base = dt.datetime(2026, 1, 1)
    rows = [{"trace_id": f"a-{i:04d}", "owner": alice, "template_name": "t", "steps": [], "status": "queued",
             "created_at": base + dt.timedelta(seconds=i)} for i in range(300)]
    rows += [{"trace_id": "b-late", "owner": bob, "template_name": "t", "steps": [], "status": "queued",
              "created_at": base + dt.timedelta(hours=1)},
             {"trace_id": "c-late", "owner": carol, "template_name": "t", "steps": [], "status": "queued",
              "created_at": base + dt.timedelta(hours=2)}]
    await core.db.aexecute(WorkflowRun.insert_many(rows))
    store = core.engine.store
    # one claim round of three: each owner's oldest, in turns
    assert await store.candidates(3) == [("a-0000", alice), ("b-late", bob), ("c-late", carol)]
    assert [t for t, _ in await store.candidates(5)] == ["a-0000", "b-late", "c-late", "a-0001", "a-0002"]
    # an owner at its cap has no candidate; one below it only what fits
    assert await store.candidates(5, per_user=2, busy={alice: 2}) == [("b-late", bob), ("c-late", carol)]
    assert [t for t, _ in await store.candidates(5, per_user=2, busy={alice: 1, bob: 2})] == ["a-0000", "c-late"]
    assert [t for t, _ in await store.candidates(9, per_user=3)] == [
        "a-0000", "b-late", "c-late", "a-0001", "a-0002"]
