"""Spend on two real `orchestra serve` processes sharing PostgreSQL (SPEC §12).

The rule proved: the money spent never exceeds a run's budget — with a 200-item foreach
16 at a time, and its owner killed with SIGKILL twice mid-run (the other process takes it
over each time). The fake model's own record of every request it answered is the
provider's bill: its cost, at the provider's prices, stays within the budget. A paused
run resumes after a top-up sent to the other process, without calling a finished item
again; a provider's max_concurrency holds across both processes; and a parent's budget
holds over its child runs with a process killed, the parent's ledger their exact sum.
"""

from __future__ import annotations

import threading
from collections import Counter
from decimal import Decimal

import pytest

from orchestra.testing.fake_answers import count_words
from tests.e2e.test_scale_out import Pair, stored, wait_for
from tests.fakes.fake_llm import FakeLLM

# An item's answer ("Echo: item 7: topic 7") is 5 tokens and costs ~$0.005; its
# reservation (~95 prompt tokens at most, 6 answer tokens) ~$0.007: 200 items would cost
# ~$1, twice the budget, and each kill loses at most 16 reservations (~$0.11).
MAX_TOKENS = 6
PRICES = {"input_per_mtok": "10", "output_per_mtok": "1000"}
IN, OUT = Decimal(10), Decimal(1000)


@pytest.fixture
def money_pair(tmp_path, postgres_url):
    with FakeLLM() as fake:
        pair = Pair(tmp_path, postgres_url, fake, env={"ORCHESTRA_LLM_MAX_TOKENS": str(MAX_TOKENS)})
        try:
            yield pair
        finally:
            pair.stop()


def priced_worker(pair, http, name="priced", **provider):
    made = http.post("/provider", json={
        "name": name, "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
        "base_url": pair.fake.base_url, "prices": PRICES, **provider})
    assert made.status_code == 201, made.text
    worker = http.post("/agent/worker", json={
        "name": f"w-{name}", "provider_id": made.json()["provider_id"], "tools": []})
    assert worker.status_code == 201, worker.text
    return worker.json()["worker_id"]


def foreach_template(http, worker, *, concurrency, limits=None, name="map"):
    body = {"name": name, "input_schema": {"type": "array"},
            "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": concurrency},
                       "agent": {"worker": worker}, "prompt": "item {{index}}: {{item}}"}]}
    if limits:
        body["limits"] = limits
    made = http.post("/workflow/template", json=body)
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


def billed(fake) -> Decimal:
    """What the provider answered, at its prices: every request the fake received, its
    whole answer counted even when the stream was cut by a kill (an upper bound)."""
    total = Decimal(0)
    for body in fake.chat_requests:
        prompt = count_words(body.get("messages") or [])
        answer = min(len(("Echo: " + body["messages"][-1]["content"]).split()), MAX_TOKENS)
        total += (prompt * IN + answer * OUT) / 1_000_000
    return total


def ended(http, trace_id, statuses=("failed", "succeeded"), timeout=120) -> dict:
    """The run once its status is one of `statuses`."""
    def read():
        run = http.get(f"/workflow/run/{trace_id}").json()
        return run if run["status"] in statuses else None
    return wait_for(read, timeout)


def finished_items(http, trace_id) -> int:
    return len([e for e in stored(http, trace_id)
                if e[1] == "step_finished" and e[2].get("path", "").startswith("m[")])


def test_200_items_under_a_budget_with_the_owner_killed_twice_never_overspend(money_pair):
    pair = money_pair
    worker = priced_worker(pair, pair.http_a)
    template = foreach_template(pair.http_a, worker, concurrency=16,
                                limits={"budget_usd": "0.50"})
    pair.fake.chunk_delay = 0.1  # half a second per item: the kills land mid-run
    started = pair.http_a.post("/workflow/run", json={
        "template_id": template, "input": [f"topic {n}" for n in range(200)]})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    wait_for(lambda: finished_items(pair.http_b, trace_id) >= 10, 60)
    pair.a.kill()  # SIGKILL: its calls in flight are lost, their reservations stay spent
    wait_for(lambda: any(e[1] == "run_resumed" for e in stored(pair.http_b, trace_id)), 60)
    pair.restart("a")
    wait_for(lambda: finished_items(pair.http_b, trace_id) >= 25, 60)
    # slow the calls B makes from now on, so that the run is surely mid-way when B dies
    # (at half a second an item, 16 at a time, it could spend the rest of its budget in
    # the moment between that count and the kill)
    pair.fake.chunk_delay = 1.0
    wait_for(lambda: pair.http_b.get(f"/workflow/run/{trace_id}").json()["status"] == "running", 10)
    pair.b.kill()  # the owner now: B took the run over
    wait_for(lambda: len([e for e in stored(pair.http_a, trace_id) if e[1] == "run_resumed"]) >= 2, 60)
    pair.fake.chunk_delay = 0.1
    run = ended(pair.http_a, trace_id)
    kinds = [e[1] for e in stored(pair.http_a, trace_id)]
    assert run["status"] == "failed" and kinds[-2:] == ["budget_exceeded", "run_failed"], kinds[-3:]
    budget = Decimal("0.50")
    assert Decimal(run["cost_usd"]) <= budget
    assert billed(pair.fake) <= budget  # the provider's own bill
    steps = [s for s in run["steps"] if s["path"].startswith("m[") and s["cost_usd"] is not None]
    assert len(steps) >= 25
    for step in steps:  # each step: its usage × the price, exactly
        usage = step["usage"]
        assert Decimal(step["cost_usd"]) == (usage["prompt_tokens"] * IN
                                             + usage["completion_tokens"] * OUT) / 1_000_000
    lost = Decimal(run["cost_usd"]) - sum(Decimal(s["cost_usd"]) for s in steps)
    # what no step shows: reservations of calls lost in the two kills (16 in flight at most)
    reservation = ((64 + 16 + 40) * IN + MAX_TOKENS * OUT) / 1_000_000
    assert 0 <= lost <= 2 * 16 * reservation


def test_pause_then_a_top_up_on_the_other_process_finishes_without_calling_items_again(money_pair):
    pair = money_pair
    worker = priced_worker(pair, pair.http_a)
    template = foreach_template(pair.http_a, worker, concurrency=2,
                                limits={"budget_usd": "0.02", "on_budget": "pause"})
    started = pair.http_a.post("/workflow/run", json={
        "template_id": template, "input": [f"topic {n}" for n in range(10)]})
    trace_id = started.json()["trace_id"]
    run = ended(pair.http_a, trace_id, ("waiting_budget", "failed", "succeeded"), 60)
    assert run["status"] == "waiting_budget", run["status"]
    assert stored(pair.http_b, trace_id)[-1][1] == "budget_exhausted"
    done_before = {s["path"] for s in run["steps"] if s["status"] == "succeeded" and s["path"].startswith("m[")}
    assert 0 < len(done_before) < 10
    assert billed(pair.fake) <= Decimal("0.02")
    raised = pair.http_b.post(f"/workflow/run/{trace_id}/budget", json={"add_usd": "1"})
    assert raised.status_code == 200, raised.text
    run = ended(pair.http_b, trace_id, timeout=60)
    assert run["status"] == "succeeded"
    counted = Counter(body["messages"][-1]["content"] for body in pair.fake.chat_requests)
    for path in done_before:
        n = int(path[2:-1])
        assert counted[f"item {n}: topic {n}"] == 1, path
    assert Decimal(run["cost_usd"]) <= Decimal("1.02")
    assert pair.http_a.post(f"/workflow/run/{trace_id}/budget", json={"add_usd": 1}).status_code == 409


def test_a_provider_max_concurrency_holds_across_two_processes(money_pair):
    pair = money_pair
    worker = priced_worker(pair, pair.http_a, limits={"max_concurrency": 3})
    template = foreach_template(pair.http_a, worker, concurrency=8)
    pair.fake.chunk_delay = 0.05
    runs = []

    def start(http):
        started = http.post("/workflow/run", json={"template_id": template,
                                                  "input": [f"t{n}" for n in range(8)]})
        runs.append((http, started.json()["trace_id"]))

    threads = [threading.Thread(target=start, args=(h,)) for h in (pair.http_a, pair.http_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for http, trace_id in runs:
        assert ended(http, trace_id)["status"] == "succeeded"
    assert len(pair.fake.chat_requests) == 16
    # 16 calls asked for at once (8 + 8, on two processes): never more than 3 answered at once
    assert 2 <= pair.fake.max_in_flight <= 3


def runs_below(database_url: str, trace_id: str) -> list[dict]:
    """Every run below `trace_id` (its child runs), straight from the store."""
    import asyncio

    import asyncpg

    async def read():
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch('SELECT trace_id, status, spent_pusd FROM workflow_run '
                                    'WHERE parent_trace_id = $1', trace_id)
            return [dict(row) for row in rows]
        finally:
            await conn.close()

    return asyncio.run(read())


def test_a_parents_budget_holds_over_its_children_with_an_owner_killed(money_pair):
    # 60 child runs, 8 at a time, one priced call each (~$0.005), under the parent's
    # $0.15: the children stop at the parent's budget; killing a process mid-run loses
    # its calls in flight (their reservations stay spent), and whoever takes over a
    # child or the parent adds nothing twice: the parent's ledger is its children's sum
    pair = money_pair
    worker = priced_worker(pair, pair.http_a)
    leaf = pair.http_a.post("/workflow/template", json={
        "name": "leaf", "steps": [{"id": "a", "agent": {"worker": worker}, "prompt": "item {{input}}"}]})
    assert leaf.status_code == 201, leaf.text
    made = pair.http_a.post("/workflow/template", json={
        "name": "fan", "input_schema": {"type": "array"}, "limits": {"budget_usd": "0.15"},
        "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": 8},
                   "workflow": {"template": "leaf", "input": "item"}}]})
    assert made.status_code == 201, made.text
    pair.fake.chunk_delay = 0.1  # half a second per call: the kill lands mid-run
    started = pair.http_a.post("/workflow/run", json={
        "template_id": made.json()["template_id"], "input": [f"topic {n}" for n in range(60)]})
    trace_id = started.json()["trace_id"]

    def done_children():
        return len([r for r in runs_below(pair.database_url, trace_id) if r["status"] == "succeeded"])

    wait_for(lambda: done_children() >= 8, 60)
    pair.a.kill()
    progress = done_children()
    wait_for(lambda: done_children() > progress + 4, 60)  # B goes on, with what A held
    pair.restart("a")
    run = ended(pair.http_a, trace_id)
    children = wait_for(lambda: (lambda rows: rows if all(
        r["status"] in ("succeeded", "failed", "cancelled", "interrupted") for r in rows) else None)(
        runs_below(pair.database_url, trace_id)), 60)
    kinds = [e[1] for e in stored(pair.http_a, trace_id)]
    assert run["status"] == "failed" and kinds[-2:] == ["budget_exceeded", "run_failed"], kinds[-3:]
    exceeded = [e[2] for e in stored(pair.http_a, trace_id) if e[1] == "budget_exceeded"][-1]
    assert exceeded["budget_trace_id"] == trace_id
    budget = Decimal("0.15")
    assert billed(pair.fake) <= budget  # the provider's own bill
    parent = pair.http_a.get(f"/workflow/run/{trace_id}").json()  # its ledger now every child ended
    assert Decimal(parent["cost_usd"]) <= budget
    # the parent's ledger is its children's, each counted once over the kill and take-overs
    assert parent["cost_usd"] is not None
    assert sum(r["spent_pusd"] or 0 for r in children) == round(Decimal(parent["cost_usd"]) * 10**12)
    reservation = ((64 + 16 + 40) * IN + MAX_TOKENS * OUT) / 1_000_000  # one call's, at most
    lost = 0
    for child in children:
        if child["status"] != "succeeded":
            continue
        step = pair.http_a.get(f"/workflow/run/{child['trace_id']}").json()["steps"][0]
        usage = step["usage"]  # the call's usage × the price, exactly
        assert Decimal(step["cost_usd"]) == (usage["prompt_tokens"] * IN
                                             + usage["completion_tokens"] * OUT) / 1_000_000
        # the child's ledger: that cost, plus the reservation of a call lost in the kill
        # (then made again by whoever took the child over)
        extra = Decimal(child["spent_pusd"]) / 10**12 - Decimal(step["cost_usd"])
        assert 0 <= extra <= reservation, (child, step)
        lost += extra > 0
    assert lost <= 8  # no more than the calls in flight when the process was killed
