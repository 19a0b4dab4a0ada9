"""CEL evaluation cannot freeze the server (issue 23, finding 2; SPEC §15).

`{{ input.map(x, x).size() }}` over 16k items held the event loop for ~15 s: every other
request waited. Comprehensions now run in the engine's worker processes with a deadline
(`ORCHESTRA_EXPRESSION_TIMEOUT_MS`), so the server keeps answering and the step fails
naming itself and the limit; what an expression is evaluated against is bounded too
(`ORCHESTRA_EXPRESSION_INPUT_MAX_BYTES`).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.db.models import RunStep, WorkflowRun
from tests.web.test_workflow_routes import API, human, make_template, wait_for

HEAVY = "input.map(x, x).size()"  # quadratic in the library: ~15 s over 16k items
MANY = list(range(16_000))


@pytest.fixture
def settings_overrides() -> dict:
    return {"expression_timeout_ms": 500, "expression_input_max_bytes": 200_000}


async def start(client, who, template_id, input):
    response = await client.post(f"{API}/run", headers=who["headers"],
                                 json={"template_id": template_id, "input": input})
    assert response.status_code == 202, response.text
    return response.json()["trace_id"]


async def slowest_answer_until_ended(client, who, watcher, trace_id) -> tuple[dict, float]:
    """Poll the run as its owner while `watcher` (another user) lists their templates:
    the run's end, and the slowest of the watcher's answers meanwhile."""
    slowest = 0.0
    for _ in range(600):
        began = time.perf_counter()
        listed = await client.get(f"{API}/template", headers=watcher["headers"])
        slowest = max(slowest, time.perf_counter() - began)
        assert listed.status_code == 200
        body = (await client.get(f"{API}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in ("failed", "succeeded"):
            return body, slowest
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run did not end: {body['status']}")


async def test_a_heavy_comprehension_fails_its_step_and_the_server_keeps_answering(client, users):
    alice, bob = await users.make("alice"), await users.make("bob")
    created = await make_template(client, alice, [human("count", "How many? {{ " + HEAVY + " }}")],
                                  input_schema={"type": "array"})
    began = time.perf_counter()
    trace_id = await start(client, alice, created["template_id"], MANY)
    run, slowest = await slowest_answer_until_ended(client, alice, bob, trace_id)
    took = time.perf_counter() - began
    assert run["status"] == "failed"
    assert "Step 'count' failed" in run["error"] and "ORCHESTRA_EXPRESSION_TIMEOUT_MS" in run["error"]
    assert "500 ms" in run["error"] and HEAVY in run["error"]
    assert slowest < 0.25, slowest  # another user's request never waited on the evaluation
    assert took < 8, took
    step = await RunStep.aget(RunStep.run == trace_id)
    assert step.status == "failed" and "ORCHESTRA_EXPRESSION_TIMEOUT_MS" in step.error


async def test_light_comprehensions_and_plain_expressions_still_run(client, users):
    alice = await users.make("alice")
    steps = [human("a", "Pick {{ input.filter(x, x > 2) }} of {{ size(input) }}",
                   when="input.exists(x, x == 3)"),
             human("b", "never", depends_on=["a"], when="input.all(x, x > 100)")]
    created = await make_template(client, alice, steps, input_schema={"type": "array"})
    trace_id = await start(client, alice, created["template_id"], [1, 2, 3, 4])
    run = await wait_for(client, alice, trace_id, "waiting_reply")
    assert run["pending_replies"][0]["prompt"] == "Pick [3,4] of 4"
    replied = await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"], json={"content": "ok"})
    assert replied.status_code == 200, replied.text
    run = await wait_for(client, alice, trace_id, "succeeded")
    assert [s["status"] for s in run["steps"]] == ["succeeded", "skipped"]


async def test_heavy_when_and_foreach_items_fail_their_step_naming_the_limit(client, users):
    alice = await users.make("alice")
    created = await make_template(client, alice, [human("gate", "Go", when=HEAVY + " > 0")],
                                  input_schema={"type": "array"})
    run, _ = await slowest_answer_until_ended(client, alice, alice, await start(
        client, alice, created["template_id"], MANY))
    assert run["status"] == "failed" and "Step 'gate' failed" in run["error"]
    assert "ORCHESTRA_EXPRESSION_TIMEOUT_MS" in run["error"]
    mapped = await make_template(client, alice, [{
        "id": "each", "foreach": {"items": "input.map(x, x)"}, "agent": {"human": True},
        "prompt": "{{ item }}"}], name="each", input_schema={"type": "array"})
    run, _ = await slowest_answer_until_ended(client, alice, alice, await start(
        client, alice, mapped["template_id"], MANY))
    assert run["status"] == "failed" and "Step 'each' failed" in run["error"]
    assert "foreach items" in run["error"] and "ORCHESTRA_EXPRESSION_TIMEOUT_MS" in run["error"]


async def test_what_an_expression_reads_is_bounded(client, users):
    alice = await users.make("alice")
    created = await make_template(client, alice, [human("h", "{{ size(input.text) }}")],
                                  input_schema={"type": "object"})
    trace_id = await start(client, alice, created["template_id"], {"text": "x" * 300_000})
    run = await wait_for(client, alice, trace_id, "failed")
    assert "Step 'h' failed" in run["error"] and "ORCHESTRA_EXPRESSION_INPUT_MAX_BYTES" in run["error"]
    assert "the limit is 200000" in run["error"]
    stored = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert stored.status == "failed"
    small = await start(client, alice, created["template_id"], {"text": "x" * 150_000})  # sandboxed, fine
    assert (await wait_for(client, alice, small, "waiting_reply"))["pending_replies"][0]["prompt"] == "150000"
