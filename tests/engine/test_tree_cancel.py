"""Cancelling the root of a tree of child runs (SPEC §14, §15b) marks the whole tree in
one statement and stops it at once, on both stores: every run ends `cancelled` with one
`run_cancelled` (and one `run.cancelled` delivery), and the store statements the cancel
costs grow with the tree by the runs' own ends only — no cancel asked again per level."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from orchestra.db.models import RunEvent, WorkflowRun
from orchestra.db.trigger_models import WebhookDelivery
from orchestra.services import auth, runs, subscriptions, templates
from orchestra.testing.fake_http import FakeHttp
from orchestra.vocabulary import TERMINAL

MIDDLES, LEAVES = 4, 4
TOTAL = 1 + MIDDLES + MIDDLES * LEAVES  # 21 runs on three levels


@pytest.fixture(scope="module")
def target():
    with FakeHttp() as server:
        yield server


@pytest.fixture
def settings_overrides(target):
    return {"step_egress_allow": f"127.0.0.1:{target.port}"}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def tree_runs(core) -> list[WorkflowRun]:
    return await core.db.list(WorkflowRun.select())


async def test_cancelling_the_root_marks_the_tree_once_and_ends_each_run_once(core, target):
    owner = (await auth.register(core, user_name="alice", password="password-123")).id
    await subscriptions.create_subscription(core, user_id=owner, url=target.url + "/hook",
                                            events=["run.cancelled"], template_id=None)
    made = {}
    for name, steps in (
        ("leaf", [{"id": "q", "agent": {"human": True}, "prompt": "wait"}]),
        ("middle", [{"id": "m", "foreach": {"items": str(list(range(LEAVES))), "max_concurrency": 8},
                     "workflow": {"template": "leaf", "input": "string(item)"}}]),
        ("top", [{"id": "t", "foreach": {"items": str(list(range(MIDDLES))), "max_concurrency": 8},
                  "workflow": {"template": "middle", "input": "string(item)"}}]),
    ):
        made[name] = (await templates.create_template(core, owner_id=owner, is_admin=False, name=name,
                                                      steps=steps)).id
    root = (await runs.start_run(core, user_id=owner, is_admin=False, template_id=made["top"],
                                 input="go")).trace_id
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        statuses = Counter(run.status for run in await tree_runs(core))
        if statuses["waiting_reply"] == MIDDLES * LEAVES and sum(statuses.values()) == TOTAL:
            break
        await asyncio.sleep(0.05)
    assert statuses["waiting_reply"] == MIDDLES * LEAVES, statuses
    await core.db.aclose()

    statements: list[str] = []
    core.db.query_hooks.append(lambda event: statements.append(event.sql))
    try:
        await runs.cancel_run(core, user_id=owner, is_admin=False, trace_id=root)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ended = [run.status for run in await tree_runs(core)]
            if ended == ["cancelled"] * TOTAL:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # the ends' looks for children started since, counted too
        if core.engine.child_steps._tasks:
            await asyncio.wait(list(core.engine.child_steps._tasks), timeout=5)
    finally:
        core.db.query_hooks.clear()
    assert ended == ["cancelled"] * TOTAL, Counter(ended)

    terminal = await core.db.list(RunEvent.select(RunEvent.run, RunEvent.kind, RunEvent.data)
                                  .where(RunEvent.kind.in_(list(TERMINAL))).tuples())
    assert sorted(kind for _, kind, _ in terminal) == ["run_cancelled"] * TOTAL
    assert len({run for run, _, _ in terminal}) == TOTAL  # one each
    reasons = {run: data["reason"] for run, _, data in terminal}
    assert reasons.pop(root) == "The run was cancelled by request."
    assert set(reasons.values()) == {f"Its parent run {root} was cancelled."}
    deliveries = await core.db.list(WebhookDelivery.select(WebhookDelivery.trace_id)
                                    .where(WebhookDelivery.event == "run.cancelled").tuples())
    assert Counter(Counter(trace for (trace,) in deliveries).values()) == {1: TOTAL}

    # The whole tree marked by one UPDATE (before: 46-61 here, one or more per run and level).
    marks = [sql for sql in statements if sql.startswith("UPDATE") and '"cancel_requested" =' in sql]
    assert len(marks) == 1, marks
    # The tree read once for the mark, then once by each run that can have children at
    # its end (the root, the middles: none started since); no leaf looks.
    looks = [sql for sql in statements if sql.startswith("WITH RECURSIVE")]
    assert len(looks) == 1 + 1 + MIDDLES, len(looks)
    # The rest is each run's own end (its last event read, its rows, its event, its
    # delivery): before, 353-421 statements in all here; now 250-340.
    assert len(statements) <= 18 * TOTAL, Counter(sql.split(" ")[0] for sql in statements)
