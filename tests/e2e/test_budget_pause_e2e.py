"""A budgeted parallel map under `on_budget: pause`, as a user sees it from outside, on a
real `orchestra serve` (SQLite, and PostgreSQL) with a priced fake model (issue 39
point 1, SPEC §15b): at every pause and at the end the run's cost is exactly its steps'
sum (no reservation of a call never sent is kept), no item says `running` while no
process holds the run, a top-up of exactly what the next call lacks lets it go on, and
its resume is a top-up's (`reason: budget`, the same attempt), not a take-over."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_scale_out import stored, wait_for
from tests.e2e.test_workflow_e2e import login
from tests.fakes.fake_llm import FakeLLM

pytestmark = pytest.mark.e2e

MAX_TOKENS = 6
PRICES = {"input_per_mtok": "10", "output_per_mtok": "1000"}
ITEMS = 12


@pytest.fixture(params=["sqlite", "postgres"])
def money_server(request, tmp_path):
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    with FakeLLM(chunk_delay=0.03) as fake:
        server = ServerProcess(tmp_path / "home", database_url=url,
                               env={"ORCHESTRA_LLM_MAX_TOKENS": str(MAX_TOKENS)}).start(timeout=90)
        try:
            http = httpx.Client(base_url=server.base_url + "/api/v1",
                                headers=login(server, "admin", "ADMINISTRATOR"), timeout=20)
            yield server, http, fake
        finally:
            server.stop()


def steps_sum(run: dict) -> Decimal:
    return sum((Decimal(s["cost_usd"]) for s in run["steps"] if s["cost_usd"] is not None), Decimal(0))


def settled(http, trace_id) -> dict:
    def read():
        run = http.get(f"/workflow/run/{trace_id}").json()
        return run if run["status"] in ("waiting_budget", "failed", "succeeded") else None
    return wait_for(read, 60)


def test_a_paused_parallel_map_costs_its_steps_and_goes_on_after_exact_top_ups(money_server):
    server, http, fake = money_server
    provider = http.post("/provider", json={
        "name": "priced", "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
        "base_url": fake.base_url, "prices": PRICES})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider.json()["provider_id"]})
    assert worker.status_code == 201, worker.text
    made = http.post("/workflow/template", json={
        "name": "map", "input_schema": {"type": "array"},
        "limits": {"budget_usd": "0.03", "on_budget": "pause"},  # ~5 of the 12 items' ~$0.005
        "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": 4},
                   "agent": {"worker": worker.json()["worker_id"]}, "prompt": "item {{index}}: {{item}}"}]})
    assert made.status_code == 201, made.text
    started = http.post("/workflow/run", json={"template_id": made.json()["template_id"],
                                               "input": [f"topic {n}" for n in range(ITEMS)]})
    trace_id = started.json()["trace_id"]

    pauses = 0
    run = settled(http, trace_id)
    while run["status"] == "waiting_budget":
        pauses += 1
        assert Decimal(run["cost_usd"]) == steps_sum(run), (pauses, run["cost_usd"], steps_sum(run))
        assert [s["path"] for s in run["steps"] if s["status"] == "running"] == [], pauses
        events = stored(http, trace_id)
        assert events[-1][1] == "budget_exhausted"
        data = events[-1][2]
        left = Decimal(data["budget_usd"]) - Decimal(data["spent_usd"])
        worst = Decimal(data["next_call_usd"])
        assert Decimal(data["spent_usd"]) == Decimal(run["cost_usd"]) and left < worst
        calls = len(fake.chat_requests)
        # the first top-up: exactly what the next call lacks; the second: enough for the rest
        add = worst - left if pauses == 1 else Decimal(1)
        raised = http.post(f"/workflow/run/{trace_id}/budget", json={"add_usd": str(add)})
        assert raised.status_code == 200, raised.text
        assert Decimal(raised.json()["budget_usd"]) == Decimal(data["budget_usd"]) + add
        run = settled(http, trace_id)
        assert len(fake.chat_requests) > calls, "the top-up did not let the next call go"
        resumed = [e for e in stored(http, trace_id) if e[1] == "run_resumed"][-1][2]
        assert resumed["reason"] == "budget" and resumed["attempt"] == 1, resumed
        assert pauses < 6
    assert run["status"] == "succeeded", (run["status"], run["error"])
    assert pauses == 2  # two top-ups to complete
    assert Decimal(run["cost_usd"]) == steps_sum(run)
    counted = Counter(body["messages"][-1]["content"] for body in fake.chat_requests)
    assert sorted(counted.values()) == [1] * ITEMS  # each item called once, none again
    assert len([s for s in run["steps"] if s["path"].startswith("m[") and s["status"] == "succeeded"]) == ITEMS
