"""Budgets are exact (SPEC §15b), in process on both stores: a foreach wider than the
connection pool under a tight budget waits for room without holding a connection (it
progresses, and other requests are served meanwhile), a run stops only when no call is
in flight and the next call's worst case does not fit (never with that much money
left), a never-sent call costs nothing (the run's cost is its steps' sum at a pause and
at the end), and the stop names the next call's worst case."""

from __future__ import annotations

import asyncio
import itertools
import time
from decimal import Decimal

import pytest

from orchestra.db.models import RunStep

API = "/api/v1/workflow"
NAMES = itertools.count()


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    # a pool smaller than the map's width: a wait that held a connection would exhaust it
    return {"llm_max_tokens": 10, "llm_retries": 0, "db_pool_size": 6}


async def start_map(client, who, worker, items, *, concurrency, limits) -> str:
    body = {"name": f"map{next(NAMES)}", "input_schema": {"type": "array"}, "limits": limits,
            "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": concurrency},
                       "agent": {"worker": worker}, "prompt": "item {{index}}: {{item}}"}]}
    made = await client.post(f"{API}/template", headers=who["headers"], json=body)
    assert made.status_code == 201, made.text
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": made.json()["template_id"], "input": items})
    assert started.status_code == 202, started.text
    return started.json()["trace_id"]


async def wait_for(client, who, trace_id, *statuses, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = (await client.get(f"{API}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in statuses:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"status stayed {body['status']}")


async def events(client, who, trace_id):
    return (await client.get(f"{API}/run/{trace_id}/events", headers=who["headers"])).json()["events"]


def step_sum(run: dict) -> Decimal:
    return sum((Decimal(s["cost_usd"]) for s in run["steps"] if s.get("cost_usd") is not None), Decimal(0))


async def test_a_map_wider_than_the_pool_under_a_tight_budget_progresses_and_stops_only_when_spent(
        client, alice, priced, fake_llm):
    # each call reserves ~$0.115 and costs ~$0.014: a budget of $0.25 holds two
    # reservations at once, so 38 of the 40 items wait for room each time
    fake_llm.chunk_delay = 0.02
    trace_id = await start_map(client, alice, priced["worker"], [f"t{n}" for n in range(40)],
                               concurrency=40, limits={"budget_usd": "0.25"})
    seen = []
    began = time.monotonic()
    while time.monotonic() - began < 30:  # another user's requests are served meanwhile
        t0 = time.monotonic()
        me = await client.get(f"{API}/template", headers=alice["headers"])
        seen.append(time.monotonic() - t0)
        assert me.status_code == 200, me.text
        run = (await client.get(f"{API}/run/{trace_id}", headers=alice["headers"])).json()
        if run["status"] in ("failed", "succeeded"):
            break
        await asyncio.sleep(0.05)
    assert run["status"] == "failed", run["status"]
    assert max(seen) < 2.0, max(seen)
    done = [s for s in run["steps"] if s["path"].startswith("m[") and s["status"] == "succeeded"]
    assert len(done) >= 10  # ~$0.014 each: it spent what it could
    # no early failure: it stopped when what is left cannot pay the next call's worst case
    spent, budget = Decimal(run["cost_usd"]), Decimal("0.25")
    exceeded = [e for e in await events(client, alice, trace_id) if e["kind"] == "budget_exceeded"][0]
    worst = Decimal(exceeded["data"]["next_call_usd"])
    assert budget - spent < worst, (spent, worst)
    assert Decimal(exceeded["data"]["spent_usd"]) == spent
    # nothing reserved for a call never sent: the run's cost is its calls' cost
    assert spent == step_sum(run)
    assert len(fake_llm.chat_requests) == len(done)  # no call cut off by the stop
    left = budget - spent
    assert f"${left} left" in run["error"] and f"up to ${worst}" in run["error"], run["error"]


async def test_a_paused_parallel_map_costs_its_steps_sum_and_a_top_up_of_the_next_call_goes_on(
        client, alice, priced, fake_llm):
    fake_llm.chunk_delay = 0.01
    trace_id = await start_map(client, alice, priced["worker"], [f"t{n}" for n in range(30)],
                               concurrency=4, limits={"budget_usd": "0.25", "on_budget": "pause"})
    run = await wait_for(client, alice, trace_id, "waiting_budget", "failed", "succeeded")
    assert run["status"] == "waiting_budget"
    assert Decimal(run["cost_usd"]) == step_sum(run)
    # no item says `running` for a run no process holds
    assert not [s["path"] for s in run["steps"] if s["status"] == "running"], run["steps"]
    rows = await RunStep.select().where(RunStep.run == trace_id).aexecute()
    assert not [r.path for r in rows if r.status == "running"]
    exhausted = [e for e in await events(client, alice, trace_id) if e["kind"] == "budget_exhausted"][-1]
    worst = Decimal(exhausted["data"]["next_call_usd"])
    left = Decimal(run["budget_usd"]) - Decimal(run["cost_usd"])
    assert left < worst
    calls = len(fake_llm.chat_requests)
    raised = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"],
                               json={"add_usd": str(worst - left)})  # exactly what the next call needs
    assert raised.status_code == 200, raised.text
    run = await wait_for(client, alice, trace_id, "waiting_budget", "failed", "succeeded")
    assert len(fake_llm.chat_requests) > calls  # it went on
    assert Decimal(run["cost_usd"]) == step_sum(run)
    while run["status"] == "waiting_budget":
        raised = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": "1"})
        assert raised.status_code == 200, raised.text
        run = await wait_for(client, alice, trace_id, "waiting_budget", "failed", "succeeded")
    assert run["status"] == "succeeded"
    assert Decimal(run["cost_usd"]) == step_sum(run)
    assert len(fake_llm.chat_requests) == 30  # each item called once: none again after a pause


async def test_retry_and_fork_carry_the_source_runs_budget(client, alice, priced, fake_llm):
    steps = [{"id": f"s{i}", "agent": {"worker": priced["worker"]}, "prompt": "Say {{input}}",
              "depends_on": [f"s{i - 1}"] if i else []} for i in range(3)]
    made = await client.post(f"{API}/template", headers=alice["headers"],
                             json={"name": f"t{next(NAMES)}", "steps": steps, "limits": {"budget_usd": "0.5"}})
    assert made.status_code == 201, made.text
    started = await client.post(f"{API}/run", headers=alice["headers"], json={
        "template_id": made.json()["template_id"], "input": "hi", "budget_usd": "0.11"})
    trace_id = started.json()["trace_id"]
    source = await wait_for(client, alice, trace_id, "failed", "succeeded")
    assert source["status"] == "failed" and source["budget_usd"] == "0.11"  # it paid for s0 only
    retried = await client.post(f"{API}/run/{trace_id}/retry", headers=alice["headers"])
    assert retried.status_code == 202, retried.text
    retry = await wait_for(client, alice, retried.json()["trace_id"], "failed", "succeeded")
    assert retry["budget_usd"] == "0.11", retry["budget_usd"]  # not the template's $0.5
    forked = await client.post(f"{API}/run/{trace_id}/fork", headers=alice["headers"], json={"from_step": "s1"})
    assert forked.status_code == 202, forked.text
    fork = await wait_for(client, alice, forked.json()["trace_id"], "failed", "succeeded")
    assert fork["budget_usd"] == "0.11", fork["budget_usd"]
    # s0 is reused, s1 costs ~$0.008 and the next reservation (~$0.106) no longer fits
    assert fork["status"] == "failed" and Decimal(fork["cost_usd"]) <= Decimal("0.11")
