"""Provider limits in process (SPEC §12): a foreach's calls wait for room under the
provider's max_concurrency and requests_per_minute, on SQLite (in memory) and on
PostgreSQL (provider_slot rows), instead of failing."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.db.provider_slot import ProviderSlot
from orchestra.engine.provider_gate import END_DELAY
from orchestra.services import agents, providers
from orchestra.testing.fake_llm import FakeLLM

API = "/api/v1/workflow"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def slow_llm():
    with FakeLLM(chunk_delay=0.02) as fake:
        yield fake


async def run_foreach(client, who, slow_llm, limits, items=8):
    core = client.app.ctx.core
    provider = await providers.create_provider(
        core, name="limited", kind="openai_compatible", model_id="fake-model", api_key="k",
        base_url=slow_llm.base_url, limits=limits)
    worker = await agents.create_worker(core, owner_id=who["user_id"], name="w",
                                        provider_id=provider.id, tools=[])
    steps = [{"id": "each", "foreach": {"items": "input", "max_concurrency": 8},
              "agent": {"worker": worker.id}, "prompt": "Say one two three {{item}}"}]
    made = await client.post(f"{API}/template", headers=who["headers"], json={
        "name": "t", "steps": steps, "input_schema": {"type": "array"}})
    assert made.status_code == 201, made.text
    started = time.monotonic()
    trace_id = (await client.post(f"{API}/run", headers=who["headers"], json={
        "template_id": made.json()["template_id"], "input": list(range(items))})).json()["trace_id"]
    for _ in range(1500):
        run = (await client.get(f"{API}/run/{trace_id}", headers=who["headers"])).json()
        if run["status"] in ("succeeded", "failed"):
            return run, time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError("the run did not end")


async def test_max_concurrency_holds_and_every_call_waits_its_turn(client, alice, slow_llm):
    run, _ = await run_foreach(client, alice, slow_llm, {"max_concurrency": 2})
    assert run["status"] == "succeeded", run
    assert len(slow_llm.chat_requests) == 8
    assert slow_llm.max_in_flight == 2


async def test_requests_per_minute_makes_calls_wait_not_fail(client, alice, slow_llm):
    run, _ = await run_foreach(client, alice, slow_llm, {"requests_per_minute": 3}, items=3)
    assert run["status"] == "succeeded"
    if client.app.ctx.core.is_postgres:  # the calls' rows, every one done
        # a call's end is stored by the gate's next transaction, or within END_DELAY
        deadline = time.monotonic() + END_DELAY + 1
        while True:
            slots = await client.app.ctx.core.db.list(ProviderSlot.select())
            if {s.state for s in slots} == {"done"} or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        assert len(slots) == 3 and {s.state for s in slots} == {"done"}
        assert all(s.tokens > 0 for s in slots)  # the reported usage, counted from each call's end


class CountingStore:
    """The gate's view of the store, counting its transactions: each write transaction,
    and each statement sent outside one (a transaction of its own)."""

    def __init__(self, db, write_transaction) -> None:
        self.db, self._write_transaction, self.transactions = db, write_transaction, 0

    def write_transaction(self):
        self.transactions += 1
        return self._write_transaction()

    def __getattr__(self, name):
        found = getattr(self.db, name)
        if name not in ("aexecute", "aexecute_sql", "list"):
            return found

        async def counted(*args, **kwargs):
            if not self.db.in_transaction():
                self.transactions += 1
            return await found(*args, **kwargs)

        return counted


# PostgreSQL only: on SQLite the limits are held in the process (no store transaction).
@pytest.mark.parametrize("both_stores", ["postgres"], indirect=True)
async def test_a_call_with_room_costs_the_store_one_transaction_of_the_gate(client, alice, slow_llm):
    core = client.app.ctx.core
    assert core.is_postgres
    gate = core.engine.gate
    counting = CountingStore(gate.db, gate.write_transaction)
    gate.db, gate.write_transaction = counting, counting.write_transaction
    provider = await providers.create_provider(
        core, name="roomy", kind="openai_compatible", model_id="fake-model", api_key="k",
        base_url=slow_llm.base_url, limits={"requests_per_minute": 1_000_000})
    worker = await agents.create_worker(core, owner_id=alice["user_id"], name="w",
                                        provider_id=provider.id, tools=[])
    steps = [{"id": f"s{i}", "agent": {"worker": worker.id}, "prompt": f"Say {i}",
              "depends_on": [f"s{i - 1}"] if i else []} for i in range(10)]
    made = await client.post(f"{API}/template", headers=alice["headers"], json={"name": "chain", "steps": steps})
    trace_id = (await client.post(f"{API}/run", headers=alice["headers"], json={
        "template_id": made.json()["template_id"], "input": "x"})).json()["trace_id"]
    for _ in range(1500):
        run = (await client.get(f"{API}/run/{trace_id}", headers=alice["headers"])).json()
        if run["status"] in ("succeeded", "failed"):
            break
        await asyncio.sleep(0.02)
    assert run["status"] == "succeeded", run
    await asyncio.sleep(END_DELAY + 0.5)  # the last call's end, stored on its own
    # each call's look (10); an end rides along with the next call's look, and is stored
    # on its own only when none comes within END_DELAY (the last one; rarely another under
    # load). A transaction for each end as well would make 20.
    assert 11 <= counting.transactions <= 13, counting.transactions
    slots = await core.db.list(ProviderSlot.select().where(ProviderSlot.provider_id == provider.id))
    assert len(slots) == 10 and {s.state for s in slots} == {"done"}
