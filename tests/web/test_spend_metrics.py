"""The spend metrics (SPEC §12) after real runs, read from `GET /metrics`: what priced
calls cost, the runs a budget stopped, how long calls waited for room under a provider's
limits, and the 429s waited out."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestra.services import agents, providers
from orchestra.testing.fake_llm import FakeLLM
from tests.observability.helpers import scrape, value
from tests.web.test_spend_routes import chain, start, wait_for

COST = "orchestra_llm_cost_usd_total"
STOPS = "orchestra_budget_exhausted_total"
WAITS = "orchestra_provider_wait_seconds"
LIMITED = "orchestra_provider_rate_limited_total"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"metrics": True, "llm_max_tokens": 10, "llm_retries": 0}


async def test_cost_and_budget_stops_are_counted_as_runs_spend(client, alice, priced, fake_llm):
    before = await scrape(client)
    free = await start(client, alice, chain(priced["worker"], 2))
    # each call reserves $0.12 and costs $0.01: a $0.125 budget stops the second call
    failing = await start(client, alice, chain(priced["worker"], 3), budget_usd="0.125")
    pausing = await start(client, alice, chain(priced["worker"], 3),
                          limits={"budget_usd": "0.125", "on_budget": "pause"})
    runs = [await wait_for(client, alice, free, "succeeded", "failed"),
            await wait_for(client, alice, failing, "failed", "succeeded"),
            await wait_for(client, alice, pausing, "waiting_budget", "failed")]
    assert [r["status"] for r in runs] == ["succeeded", "failed", "waiting_budget"]
    after = await scrape(client)
    spent = sum(Decimal(r["cost_usd"]) for r in runs)
    assert spent == Decimal("0.04")
    labels = {"provider": "fake", "model": "fake-model"}
    assert value(after, COST, **labels) - value(before, COST, **labels) == pytest.approx(float(spent), abs=1e-12)
    assert value(after, STOPS) - value(before, STOPS) == 2


async def test_waits_for_room_and_429s_are_measured_per_provider(client, alice):
    with FakeLLM(chunk_delay=0.05) as slow:
        core = client.app.ctx.core
        provider = await providers.create_provider(
            core, name="narrow", kind="openai_compatible", model_id="fake-model", api_key="k",
            base_url=slow.base_url, limits={"max_concurrency": 1})
        worker = await agents.create_worker(core, owner_id=alice["user_id"], name="w",
                                            provider_id=provider.id, tools=[])
        before = await scrape(client)
        steps = [{"id": "each", "foreach": {"items": "[1, 2, 3]", "max_concurrency": 3},
                  "agent": {"worker": worker.id}, "prompt": "Say one two three {{item}}"}]
        run = await wait_for(client, alice, await start(client, alice, steps), "succeeded", "failed")
        assert run["status"] == "succeeded", run
        after = await scrape(client)
        count = value(after, f"{WAITS}_count", provider="narrow") - value(before, f"{WAITS}_count", provider="narrow")
        waited = value(after, f"{WAITS}_sum", provider="narrow") - value(before, f"{WAITS}_sum", provider="narrow")
        assert count == 3  # every call of a limited provider is measured
        # one at a time: the second call waited for the first, the third for both
        assert waited >= 0.05 * 3, waited
        assert value(after, f"{WAITS}_bucket", provider="narrow", le="+Inf") - value(
            before, f"{WAITS}_bucket", provider="narrow", le="+Inf") == 3

        slow.script_error(429, retry_after=0.05).script_error(429, retry_after=0.05)
        run = await wait_for(client, alice, await start(client, alice, [
            {"id": "one", "agent": {"worker": worker.id}, "prompt": "Say hi"}]), "succeeded", "failed")
        assert run["status"] == "succeeded" and run["steps"][0]["attempt"] == 1, run
        latest = await scrape(client)
        assert value(latest, LIMITED, provider="narrow") - value(after, LIMITED, provider="narrow") == 2
        assert value(latest, f"{WAITS}_count", provider="narrow") - value(after, f"{WAITS}_count", provider="narrow") == 3
