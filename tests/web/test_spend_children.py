"""Costs and budgets of child runs (SPEC §12, §14), in process on both stores: a child's
cost rolls up into every run above it, counted once (retried children included); a
budget bounds the runs below it — `fail` ends the chain, `pause` waits until a top-up of
the child or of the run whose budget it is; cancelling a parent ends a child that waits
for budget."""

from __future__ import annotations

import asyncio
import itertools
from decimal import Decimal

import pytest

from orchestra.db.models import RunStep, WorkflowRun
from orchestra.money.amounts import from_pico
from tests.web.test_spend_routes import API, chain, events, expected, wait_for

NAMES = itertools.count()


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():  # as tests/web/test_spend_routes.py's
    return {"llm_max_tokens": 10, "llm_retries": 0}


async def template(client, who, steps, *, name=None, limits=None) -> str:
    extra = {"limits": limits} if limits else {}
    made = await client.post(f"{API}/template", headers=who["headers"],
                             json={"name": name or f"c{next(NAMES)}", "steps": steps, **extra})
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


async def start(client, who, template_id, **run) -> str:
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": template_id, "input": "hi", **run})
    assert started.status_code == 202, started.text
    return started.json()["trace_id"]


def workflow(step_id: str, name: str, **more) -> dict:
    return {"id": step_id, "workflow": {"template": name, "input": "input"}, **more}


async def rows(client, trace_id: str) -> list[WorkflowRun]:
    """The run and every run below it."""
    db = client.app.ctx.core.db
    found, level = [], [trace_id]
    while level:
        found += await db.list(WorkflowRun.select().where(WorkflowRun.trace_id.in_(level)))
        level = [r.trace_id for r in await db.list(WorkflowRun.select().where(
            WorkflowRun.parent_trace_id.in_(level)))]
    return found


def step_costs(run: dict) -> Decimal:
    return sum((Decimal(s["cost_usd"]) for s in run["steps"] if s["cost_usd"] is not None), Decimal(0))


async def test_a_childs_cost_rolls_up_into_every_run_above_it(client, alice, priced, fake_llm):
    worker = priced["worker"]
    await template(client, alice, chain(worker, 2), name="leaf")
    await template(client, alice, [*chain(worker, 1), workflow("sub", "leaf", depends_on=["s0"])], name="middle")
    top = await template(client, alice, [workflow("mid", "middle")])
    trace_id = await start(client, alice, top)
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "succeeded", run
    chain_rows = {r.depth: r for r in await rows(client, trace_id)}
    assert sorted(chain_rows) == [1, 2, 3]
    leaf = await wait_for(client, alice, chain_rows[3].trace_id, "succeeded")
    middle = await wait_for(client, alice, chain_rows[2].trace_id, "succeeded")
    assert len(fake_llm.chat_requests) == 3
    # each model call's cost is its usage × price; each run's cost is its steps' sum, and
    # a workflow step costs what its child's tree cost
    for s in leaf["steps"]:
        assert Decimal(s["cost_usd"]) == expected(s["usage"])
    assert Decimal(leaf["cost_usd"]) == step_costs(leaf) == expected(leaf["steps"][0]["usage"]) * 2
    by_id = {s["step_id"]: s for s in middle["steps"]}
    assert Decimal(by_id["sub"]["cost_usd"]) == Decimal(leaf["cost_usd"])
    assert Decimal(middle["cost_usd"]) == step_costs(middle) == Decimal(by_id["s0"]["cost_usd"]) + Decimal(leaf["cost_usd"])
    assert Decimal(run["cost_usd"]) == step_costs(run) == Decimal(middle["cost_usd"])
    assert Decimal(run["cost_usd"]) == sum(expected(s["usage"]) for s in leaf["steps"] + [by_id["s0"]])
    finished = [e for e in await events(client, alice, trace_id) if e["kind"] == "step_finished"]
    assert finished[0]["data"]["cost_usd"] == run["steps"][0]["cost_usd"]
    # the usage report counts model calls once: not again on the workflow steps
    usage = (await client.get("/api/v1/usage?group_by=user", headers=alice["headers"])).json()["rows"]
    assert usage == [{"key": alice["user_id"], "name": "alice", "runs": 2, "calls": 3,
                      "input_tokens": usage[0]["input_tokens"], "output_tokens": usage[0]["output_tokens"],
                      "cost_usd": run["cost_usd"]}]


async def test_a_retried_childs_cost_counts_once_per_attempt(client, alice, priced, fake_llm):
    # the child spends one call, then fails (its `when` cannot be evaluated on text); the
    # parent's step tries twice: two children, each counted once, both in the step's cost
    worker = priced["worker"]
    failing = [*chain(worker, 1), {"id": "bad", "agent": {"worker": worker}, "prompt": "no",
                                   "depends_on": ["s0"], "when": "int(steps.s0.output) > 0"}]
    await template(client, alice, failing, name="flaky")
    top = await template(client, alice, [workflow("sub", "flaky", retry={"max_attempts": 2, "backoff_seconds": 0})])
    trace_id = await start(client, alice, top)
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "failed", run
    assert len(fake_llm.chat_requests) == 2
    kids = [r for r in await rows(client, trace_id) if r.depth == 2]
    assert len(kids) == 2 and all(k.status == "failed" for k in kids)
    each = [from_pico(k.spent_pusd) for k in kids]
    assert each[0] == each[1] == Decimal("0.01")
    assert Decimal(run["cost_usd"]) == sum(each) == Decimal(run["steps"][0]["cost_usd"])


async def test_a_parents_fail_budget_stops_its_child_before_the_call_it_cannot_pay(
        client, alice, priced, fake_llm):
    # each call reserves $0.12 and costs $0.01 (test_spend_routes): the parent's $0.125
    # pays for the child's first call only; the child has no budget of its own
    await template(client, alice, chain(priced["worker"], 3), name="leaf")
    top = await template(client, alice, [workflow("sub", "leaf", retry={"max_attempts": 3, "backoff_seconds": 0})],
                         limits={"budget_usd": "0.125"})
    trace_id = await start(client, alice, top)
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "failed" and run["budget_usd"] == "0.125", run
    assert len(fake_llm.chat_requests) == 1
    child = [r for r in await rows(client, trace_id) if r.depth == 2]
    assert len(child) == 1 and child[0].status == "failed"  # the budget stop is not retried
    child_events = await events(client, alice, child[0].trace_id)
    keys = ("budget_usd", "spent_usd", "budget_trace_id")
    exceeded = [{k: e["data"][k] for k in keys} for e in child_events if e["kind"] == "budget_exceeded"]
    assert exceeded == [{"budget_usd": "0.125", "spent_usd": "0.01", "budget_trace_id": trace_id}]
    kinds = [e["kind"] for e in await events(client, alice, trace_id)]
    assert kinds[-2:] == ["budget_exceeded", "run_failed"]
    assert Decimal(run["cost_usd"]) == from_pico(child[0].spent_pusd) == Decimal("0.01")


async def test_a_child_has_its_own_templates_budget_under_its_parents(client, alice, priced, fake_llm):
    # the child's template pays for one call ($0.125; each reserves $0.12, costs $0.01),
    # the parent has no budget: the child stops at its own budget, and so does its step
    await template(client, alice, chain(priced["worker"], 3), name="capped", limits={"budget_usd": "0.125"})
    top = await template(client, alice, [workflow("sub", "capped")])
    trace_id = await start(client, alice, top)
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "failed" and run["budget_usd"] is None, run
    assert len(fake_llm.chat_requests) == 1
    [child] = [r for r in await rows(client, trace_id) if r.depth == 2]
    shown = await wait_for(client, alice, child.trace_id, "failed")
    assert shown["budget_usd"] == "0.125" and Decimal(shown["cost_usd"]) == Decimal("0.01")
    exceeded = [e["data"] for e in await events(client, alice, child.trace_id) if e["kind"] == "budget_exceeded"]
    assert [(e["budget_usd"], e["budget_trace_id"]) for e in exceeded] == [("0.125", child.trace_id)]
    assert Decimal(run["cost_usd"]) == Decimal("0.01")


async def test_parallel_children_never_spend_more_than_the_parents_budget(client, alice, priced, fake_llm):
    # eight children at once (as many as a SQLite pool's connections), each wanting two
    # calls ($0.12 reserved, $0.01 spent): $0.2 pays for nine calls at most, one at a
    # time; whatever the interleaving, what is spent and reserved stays within the
    # parent's budget, and it is their sum
    await template(client, alice, chain(priced["worker"], 2), name="leaf")
    top = await template(client, alice, [{
        "id": "each", "foreach": {"items": "[1, 2, 3, 4, 5, 6, 7, 8]", "max_concurrency": 8},
        "workflow": {"template": "leaf", "input": "input"}}], limits={"budget_usd": "0.2"})
    trace_id = await start(client, alice, top)
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "failed", run
    await asyncio.sleep(0.5)  # children still stopping
    found = await rows(client, trace_id)
    parent = next(r for r in found if r.depth == 1)
    kids = [r for r in found if r.depth == 2]
    assert 0 < len(fake_llm.chat_requests) <= 9
    assert parent.spent_pusd <= parent.budget_pusd
    assert parent.spent_pusd == sum(k.spent_pusd or 0 for k in kids)
    # each answered call costs $0.01; one cut off by the stop keeps its reservation
    assert Decimal("0.01") * len(fake_llm.chat_requests) <= from_pico(parent.spent_pusd) <= Decimal("0.2")
    steps = await client.app.ctx.core.db.list(RunStep.select().where(
        RunStep.run.in_([k.trace_id for k in kids]) & RunStep.cost_usd.is_null(False)))
    assert sum(Decimal(s.cost_usd) for s in steps) <= from_pico(parent.spent_pusd)


async def test_pause_waits_for_a_top_up_of_the_child_or_of_the_budgets_run(client, alice, priced, fake_llm):
    await template(client, alice, chain(priced["worker"], 3), name="leaf")
    top = await template(client, alice, [workflow("sub", "leaf")],
                         limits={"budget_usd": "0.125", "on_budget": "pause"})
    trace_id = await start(client, alice, top)
    child = await _paused_child(client, alice, trace_id)
    assert (await wait_for(client, alice, trace_id, "running"))["status"] == "running"  # it waits on its child
    shown = [e["data"] for e in await events(client, alice, trace_id) if e["kind"] == "budget_exhausted"]
    assert len(shown) == 1 and shown[0]["child_trace_id"] == child and shown[0]["budget_trace_id"] == trace_id
    # a top-up of the child raises the parent's budget; too little: it pauses again
    raised = await client.post(f"{API}/run/{child}/budget", headers=alice["headers"], json={"add_usd": "0.001"})
    assert raised.status_code == 200, raised.text
    assert raised.json()["budget_trace_id"] == trace_id and raised.json()["budget_usd"] == "0.126"
    await _paused_child(client, alice, trace_id, times=2)
    raised = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": "1"})
    assert raised.status_code == 200, raised.text
    run = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert run["status"] == "succeeded", run
    assert len(fake_llm.chat_requests) == 3  # the child's finished step was not called again
    assert Decimal(run["cost_usd"]) == Decimal("0.03") and run["budget_usd"] == "1.126"
    again = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": 1})
    assert again.status_code == 409 and again.json()["error"] == "ConflictError"


async def test_cancelling_a_parent_ends_a_child_waiting_for_budget(client, alice, priced, fake_llm):
    await template(client, alice, chain(priced["worker"], 3), name="leaf")
    top = await template(client, alice, [workflow("sub", "leaf")],
                         limits={"budget_usd": "0.125", "on_budget": "pause"})
    trace_id = await start(client, alice, top)
    child = await _paused_child(client, alice, trace_id)
    cancelled = await client.post(f"{API}/cancel/{trace_id}", headers=alice["headers"])
    assert cancelled.status_code == 200, cancelled.text
    assert (await wait_for(client, alice, child, "cancelled", "failed"))["status"] == "cancelled"
    assert (await wait_for(client, alice, trace_id, "cancelled", "failed"))["status"] == "cancelled"
    steps = await client.app.ctx.core.db.list(RunStep.select().where(RunStep.run == child))
    assert sorted(s.status for s in steps) == ["cancelled", "skipped", "succeeded"]


async def _paused_child(client, who, trace_id: str, times: int = 1) -> str:
    """The child of `trace_id` once it waits for budget (for the `times`-th time)."""
    for _ in range(500):
        kids = [r for r in await rows(client, trace_id) if r.depth == 2]
        if kids and kids[0].status == "waiting_budget":
            paused = [e for e in await events(client, who, kids[0].trace_id) if e["kind"] == "budget_exhausted"]
            if len(paused) >= times:
                return kids[0].trace_id
        await asyncio.sleep(0.02)
    raise AssertionError("the child did not wait for budget")
