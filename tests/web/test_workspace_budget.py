"""A workspace's monthly budget (SPEC §16 "Money", with §12's reservation rule), in
process on both stores: every call of every run of the workspace reserves its worst case
under the month's running total; a call that does not fit is not sent, and the run
stops as the workspace's `on_budget` says (`fail`: `budget_exceeded` then failed;
`pause`: `waiting_budget` until the limit is raised); other workspaces are not touched;
last month's spend does not count; a cap set mid-month counts the month so far; many
calls at once never overspend it.

Prices (tests/web/conftest.PRICES): a call of `chain`'s prompt reserves $0.12 (an upper
bound of 100 prompt tokens, and 10 answer tokens) and costs $0.01."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
from decimal import Decimal

import pytest

from orchestra.db.models import WorkflowRun
from orchestra.db.workspace_models import WorkspaceMonth
from tests.web.test_spend_routes import events, wait_for

API = "/api/v1/workflow"
WS = "/api/v1/workspace"
NAMES = itertools.count()


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"llm_max_tokens": 10, "llm_retries": 0}


def chain(worker: str, n: int) -> list[dict]:
    return [{"id": f"s{i}", "agent": {"worker": worker}, "prompt": "Say {{input}} fake:cached=2",
             "depends_on": [f"s{i - 1}"] if i else []} for i in range(n)]


def this_month() -> str:
    now = dt.datetime.now(dt.UTC)
    return f"{now.year:04d}-{now.month:02d}"


def last_month() -> str:
    first = dt.datetime.now(dt.UTC).replace(day=1)
    before = first - dt.timedelta(days=1)
    return f"{before.year:04d}-{before.month:02d}"


async def team(client, who, **limits) -> str:
    made = await client.post(WS, headers=who["headers"], json={"name": f"team{next(NAMES)}", "limits": limits or None})
    assert made.status_code == 201, made.text
    return made.json()["workspace_id"]


async def worker_in(client, who, priced, workspace_id) -> str:
    """A worker of the workspace on the priced provider: a team template's steps name
    their own workspace's workers (SPEC §16: references never cross workspaces)."""
    made = await client.post("/api/v1/agent/worker", headers=who["headers"], json={
        "name": f"w{next(NAMES)}", "provider_id": priced["provider"], "workspace_id": workspace_id})
    assert made.status_code == 201, made.text
    return made.json()["worker_id"]


async def start(client, who, steps, workspace_id=None, *, input_value="hi", **template):
    place = {"workspace_id": workspace_id} if workspace_id else {}
    made = await client.post(f"{API}/template", headers=who["headers"],
                             json={"name": f"t{next(NAMES)}", "steps": steps, **place, **template})
    assert made.status_code == 201, made.text
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": made.json()["template_id"], "input": input_value})
    assert started.status_code == 202, started.text
    return started.json()["trace_id"]


async def month_spent(workspace_id: str, month: str | None = None) -> Decimal:
    row = await WorkspaceMonth.aget_or_none((WorkspaceMonth.workspace == workspace_id)
                                            & (WorkspaceMonth.month == (month or this_month())))
    return Decimal(0) if row is None else Decimal(row.spent_pusd) / 10**12


async def test_a_second_run_that_the_month_cannot_pay_fails_before_the_call(client, alice, priced, fake_llm):
    # $0.135 a month: the first run's call reserves $0.12 and costs $0.01; the second run's
    # first call fits ($0.13), its second ($0.14) does not and is never sent.
    wid = await team(client, alice, monthly_budget_usd="0.135")
    worker = await worker_in(client, alice, priced, wid)
    first = await start(client, alice, chain(worker, 1), wid)
    assert (await wait_for(client, alice, first, "succeeded", "failed"))["status"] == "succeeded"
    second = await start(client, alice, chain(worker, 2), wid)
    run = await wait_for(client, alice, second, "succeeded", "failed")
    assert run["status"] == "failed", run
    assert len(fake_llm.chat_requests) == 2
    assert run["cost_usd"] == "0.01" and run["budget_usd"] is None
    kinds = [e["kind"] for e in await events(client, alice, second)]
    assert kinds[-2:] == ["budget_exceeded", "run_failed"]
    exceeded = [e for e in await events(client, alice, second) if e["kind"] == "budget_exceeded"][0]["data"]
    assert {k: v for k, v in exceeded.items() if k not in ("trace_id", "seq", "ts")} == {
        "budget_usd": "0.135", "spent_usd": "0.02", "budget_trace_id": None, "next_call_usd": "0.12",
        "workspace_id": wid, "month": this_month()}
    assert "monthly budget of workspace" in run["error"] and "$0.135" in run["error"]
    assert "the next call may cost up to $0.12" in run["error"], run["error"]
    assert await month_spent(wid) == Decimal("0.02") <= Decimal("0.135")  # no reservation left behind
    # a run of another workspace (alice's personal one, no cap) is not touched
    own = await start(client, alice, chain(priced["worker"], 3))
    assert (await wait_for(client, alice, own, "succeeded", "failed"))["status"] == "succeeded"
    # nor one of another team's cap: its month is its own
    other = await team(client, alice, monthly_budget_usd="0.135")
    theirs_worker = await worker_in(client, alice, priced, other)
    theirs = await start(client, alice, chain(theirs_worker, 2), other)
    assert (await wait_for(client, alice, theirs, "succeeded", "failed"))["status"] == "succeeded"
    assert await month_spent(other) == Decimal("0.02") and await month_spent(wid) == Decimal("0.02")


async def test_pause_waits_until_the_workspace_limit_is_raised(client, alice, priced, fake_llm):
    wid = await team(client, alice, monthly_budget_usd="0.135", on_budget="pause")
    worker = await worker_in(client, alice, priced, wid)
    first = await start(client, alice, chain(worker, 1), wid)
    assert (await wait_for(client, alice, first, "succeeded", "failed"))["status"] == "succeeded"
    second = await start(client, alice, chain(worker, 3), wid)
    run = await wait_for(client, alice, second, "waiting_budget", "failed", "succeeded")
    assert run["status"] == "waiting_budget", run
    row = await WorkflowRun.aget(WorkflowRun.trace_id == second)
    assert row.owner_process is None and row.lease_until is None
    last = (await events(client, alice, second))[-1]
    assert last["kind"] == "budget_exhausted" and last["data"]["workspace_id"] == wid
    assert len(fake_llm.chat_requests) == 2
    # a run's top-up does not pay for its workspace's month: 409 naming the way on
    topped = await client.post(f"{API}/run/{second}/budget", headers=alice["headers"], json={"add_usd": "1"})
    assert topped.status_code == 409 and "monthly_budget_usd" in topped.json()["message"], topped.text
    raised = await client.put(f"{WS}/{wid}", headers=alice["headers"],
                              json={"limits": {"monthly_budget_usd": "1", "on_budget": "pause"}})
    assert raised.status_code == 200, raised.text
    run = await wait_for(client, alice, second, "succeeded", "failed")
    assert run["status"] == "succeeded", run
    assert len(fake_llm.chat_requests) == 4  # s0 was not called again
    assert await month_spent(wid) == Decimal("0.04")


async def test_a_lowered_limit_holds_from_the_next_call_and_a_removed_one_stops_nothing(
        client, alice, priced, fake_llm):
    wid = await team(client, alice, monthly_budget_usd="5")
    worker = await worker_in(client, alice, priced, wid)
    first = await start(client, alice, chain(worker, 1), wid)
    assert (await wait_for(client, alice, first, "succeeded", "failed"))["status"] == "succeeded"
    lowered = await client.put(f"{WS}/{wid}", headers=alice["headers"], json={"limits": {"monthly_budget_usd": "0.1"}})
    assert lowered.status_code == 200, lowered.text
    stopped = await start(client, alice, chain(worker, 1), wid)
    assert (await wait_for(client, alice, stopped, "succeeded", "failed"))["status"] == "failed"
    assert len(fake_llm.chat_requests) == 1
    removed = await client.put(f"{WS}/{wid}", headers=alice["headers"], json={"limits": None})
    assert removed.status_code == 200, removed.text
    free = await start(client, alice, chain(worker, 2), wid)
    assert (await wait_for(client, alice, free, "succeeded", "failed"))["status"] == "succeeded"


async def test_a_child_run_the_month_cannot_pay_stops_its_parent_too(client, alice, priced, fake_llm):
    wid = await team(client, alice, monthly_budget_usd="0.135")
    worker = await worker_in(client, alice, priced, wid)
    leaf = f"leaf{next(NAMES)}"
    made = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": leaf, "steps": chain(worker, 3), "workspace_id": wid})
    assert made.status_code == 201, made.text
    parent = await start(client, alice, [{"id": "sub", "workflow": {"template": leaf, "input": "input"}}], wid)
    run = await wait_for(client, alice, parent, "succeeded", "failed")
    assert run["status"] == "failed", run
    assert len(fake_llm.chat_requests) == 2  # $0.12, $0.13 fit; $0.14 does not
    assert "monthly budget" in run["error"], run["error"]
    over = [e["data"] for e in await events(client, alice, parent) if e["kind"] == "budget_exceeded"]
    assert over and over[-1]["workspace_id"] == wid and over[-1]["next_call_usd"] == "0.12"
    assert run["cost_usd"] == "0.02" and await month_spent(wid) == Decimal("0.02")


async def test_last_months_spend_does_not_count(client, alice, priced, fake_llm):
    wid = await team(client, alice, monthly_budget_usd="0.135")
    worker = await worker_in(client, alice, priced, wid)
    first = await start(client, alice, chain(worker, 1), wid)
    assert (await wait_for(client, alice, first, "succeeded", "failed"))["status"] == "succeeded"
    assert await month_spent(wid) == Decimal("0.01")
    # that spend was last month's: this month starts from zero
    moved = await client.app.ctx.core.db.aexecute(WorkspaceMonth.update(month=last_month()).where(
        (WorkspaceMonth.workspace == wid) & (WorkspaceMonth.month == this_month())))
    assert moved == 1
    second = await start(client, alice, chain(worker, 2), wid)  # $0.12, then $0.13: both fit
    assert (await wait_for(client, alice, second, "succeeded", "failed"))["status"] == "succeeded"
    assert await month_spent(wid) == Decimal("0.02") and await month_spent(wid, last_month()) == Decimal("0.01")


async def test_a_cap_set_mid_month_counts_the_month_so_far(client, alice, priced, fake_llm):
    wid = await team(client, alice)
    worker = await worker_in(client, alice, priced, wid)
    first = await start(client, alice, chain(worker, 1), wid)
    assert (await wait_for(client, alice, first, "succeeded", "failed"))["status"] == "succeeded"
    assert await WorkspaceMonth.aget_or_none(WorkspaceMonth.workspace == wid) is None  # no cap: no cost
    capped = await client.put(f"{WS}/{wid}", headers=alice["headers"], json={"limits": {"monthly_budget_usd": "0.135"}})
    assert capped.status_code == 200, capped.text
    assert await month_spent(wid) == Decimal("0.01")
    second = await start(client, alice, chain(worker, 2), wid)  # $0.13 fits, $0.14 does not
    assert (await wait_for(client, alice, second, "succeeded", "failed"))["status"] == "failed"
    assert len(fake_llm.chat_requests) == 2


async def test_many_runs_and_a_wide_map_at_once_never_overspend_the_month(client, alice, priced, fake_llm):
    # $0.20 a month; 6 runs of a 4-item map, all at once, each item a call that reserves
    # $0.12 and costs $0.01: the 24 calls would cost $0.24, more than the cap; a call
    # fits only while the month's spend and open reservations are at most $0.08 (a run
    # whose call does not fit stops: it does not wait for other runs' reservations).
    fake_llm.chunk_delay = 0.005  # calls overlap
    cap = Decimal("0.20")
    wid = await team(client, alice, monthly_budget_usd=str(cap))
    worker = await worker_in(client, alice, priced, wid)
    body = {"input_schema": {"type": "array"}}
    steps = [{"id": "m", "foreach": {"items": "input", "max_concurrency": 4},
              "agent": {"worker": worker}, "prompt": "Say {{item}} fake:cached=2"}]
    runs = await asyncio.gather(*(start(client, alice, steps, wid, input_value=[f"x{i}" for i in range(4)], **body)
                                  for _ in range(6)))
    ended = [await wait_for(client, alice, trace_id, "succeeded", "failed", timeout=60) for trace_id in runs]
    spent = sum((Decimal(run["cost_usd"] or 0) for run in ended), Decimal(0))
    assert spent <= cap, spent
    assert await month_spent(wid) == spent  # every reservation settled, none lost
    assert any(run["status"] == "failed" for run in ended)
    assert 1 <= len(fake_llm.chat_requests) <= 9  # the ninth fits only after $0.08 settled
    stops = [e for trace_id in runs for e in await events(client, alice, trace_id) if e["kind"] == "budget_exceeded"]
    assert stops and all(e["data"]["workspace_id"] == wid for e in stops)


async def test_the_months_reservations_from_many_connections_at_once_never_pass_the_cap(client, alice):
    """The month's conditional statement, from as many transactions at once as the pool
    holds (PostgreSQL: separate sessions, as from separate processes): what is reserved
    never passes the cap, and exactly as many fit as the cap allows."""
    from orchestra.engine.store.workspace_month import WorkspaceMonths

    core = client.app.ctx.core
    wid = await team(client, alice, monthly_budget_usd="1")  # 10**12 pico-dollars
    months = WorkspaceMonths(core.db)
    key = (wid, this_month())
    pico = 7 * 10**10  # $0.07: 14 fit under $1

    async def one() -> bool:
        async with core.write_transaction():
            fits = await months.reserve(key, pico)
        await core.db.aclose()
        return fits

    results = await asyncio.gather(*(one() for _ in range(40)))
    assert sum(results) == 14
    assert await month_spent(wid) == Decimal("0.98")
