"""Issue 23, finding 6: rendered prompts and step outputs are bounded (in UTF-8 bytes),
and a rendered prompt is stored once per step instance — through the routes, against
the fake provider, with what the store holds checked."""

from __future__ import annotations

import itertools
import json

import pytest

from orchestra.db.models import RunEvent
from tests.web.test_workflow_routes import API, human, make_template, wait_for

PROMPT_LIMIT = 4096
OUTPUT_LIMIT = 1000
_names = itertools.count()


@pytest.fixture
def database_url(both_stores: str) -> str:
    """Every test here on SQLite and on PostgreSQL: both store the events checked."""
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"prompt_max_bytes": PROMPT_LIMIT, "step_output_max_bytes": OUTPUT_LIMIT}



@pytest.fixture
async def worker(alice, make_worker):
    return await make_worker(alice, ["ask_user"])


async def run(client, who, steps, input, *, end=("succeeded", "failed")) -> dict:
    """Start a run of a new template and wait until it reaches one of `end`."""
    template = await make_template(client, who, steps, name=f"t{next(_names)}")
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": template["template_id"], "input": input})
    assert started.status_code == 202, started.text
    return await wait_for(client, who, started.json()["trace_id"], *end)


async def stored_events(client, trace_id: str) -> list[RunEvent]:
    query = RunEvent.select().where(RunEvent.run == trace_id).order_by(RunEvent.seq)
    return await client.app.ctx.core.db.list(query)


def largest_event(events: list[RunEvent]) -> int:
    return max(len(json.dumps(e.data, ensure_ascii=False).encode()) for e in events)


@pytest.mark.parametrize("agent", ["worker", "human"])
async def test_a_prompt_rendering_past_the_limit_fails_its_step_and_stores_nothing_large(
        client, alice, worker, fake_llm, agent):
    """Finding 6 at a small scale: `{{input}}` ×100 over a 1 KB input renders to 100 KB,
    past a 4 KiB limit: the step fails naming itself, the size, the limit and the
    setting; no event carries the prompt; the provider is never called."""
    who = {"worker": worker} if agent == "worker" else {"human": True}
    steps = [{"id": "big", "agent": who, "prompt": "{{input}} " * 100}]
    body = await run(client, alice, steps, "x" * 1000)
    assert body["status"] == "failed", body
    error = body["error"]
    assert "'big'" in error and f"limit of {PROMPT_LIMIT} bytes" in error
    assert "ORCHESTRA_PROMPT_MAX_BYTES" in error and "reached" in error
    [step] = body["steps"]
    assert step["status"] == "failed" and "ORCHESTRA_PROMPT_MAX_BYTES" in step["error"]
    events = await stored_events(client, body["trace_id"])
    kinds = [e.kind for e in events]
    assert "step_started" not in kinds and "reply_requested" not in kinds and "step_failed" in kinds
    assert largest_event(events) < 2 * 1000 + 1024  # the input (run_started) and small events only
    assert body["pending_replies"] == [] and fake_llm.chat_requests == []


async def test_an_inner_step_of_a_foreach_is_bounded_too(client, alice, worker, fake_llm):
    """Items render their own prompts: one past the limit fails that item's step, named by path."""
    steps = [{"id": "each", "foreach": {"items": "input"}, "agent": {"worker": worker},
              "prompt": "{{item}}{{item}}{{item}}"}]
    template = await make_template(client, alice, steps, name="each",
                                   input_schema={"type": "array", "items": {"type": "string"}})
    started = await client.post(f"{API}/run", headers=alice["headers"], json={
        "template_id": template["template_id"], "input": ["short", "y" * 1500]})
    assert started.status_code == 202, started.text
    body = await wait_for(client, alice, started.json()["trace_id"], "succeeded", "failed")
    assert body["status"] == "failed" and "'each[1]'" in body["error"], body
    assert "ORCHESTRA_PROMPT_MAX_BYTES" in body["error"]
    events = await stored_events(client, body["trace_id"])
    assert largest_event(events) < 3 * 1500
    assert not any(e.kind == "step_started" and e.data.get("path") == "each[1]" for e in events)


async def test_the_prompt_limit_counts_utf8_bytes(client, alice, worker, fake_llm):
    """1,500 '€' are 1,500 characters but 4,500 bytes: past a 4,096-byte limit."""
    steps = [{"id": "euro", "agent": {"worker": worker}, "prompt": "{{input}}"}]
    body = await run(client, alice, steps, "€" * 1500)
    assert body["status"] == "failed" and "it reached 4500 bytes" in body["error"], body
    fits = await run(client, alice, steps, "€" * 1300)  # 3,900 bytes
    assert fits["status"] == "succeeded", fits


async def test_a_prompt_is_stored_once_per_step_instance(client, alice, worker, fake_llm):
    """Below the limit: the agent step's rendered prompt is in its `step_started` only; the
    human step's question is in its `reply_requested` only (its `step_started` has none),
    and the run detail and stream clients still find both where the docs say."""
    filler = "z" * 900
    steps = [{"id": "ask", "agent": {"worker": worker}, "prompt": "A: {{input}}{{input}}"},
             human("h", "Q: {{input}}{{input}}{{input}}", ["ask"])]
    body = await run(client, alice, steps, filler, end=("waiting_reply", "failed"))
    assert body["status"] == "waiting_reply", body
    agent_prompt, question = "A: " + filler * 2, "Q: " + filler * 3
    events = await stored_events(client, body["trace_id"])
    holding = {text: [e.kind for e in events if text in json.dumps(e.data, ensure_ascii=False)]
               for text in (agent_prompt, question)}
    assert holding == {agent_prompt: ["step_started"], question: ["reply_requested"]}
    started = {e.data["step_id"]: e.data for e in events if e.kind == "step_started"}
    assert started["ask"]["prompt"] == agent_prompt and "prompt" not in started["h"]
    assert started["h"]["agent"] == {"human": True}
    assert body["pending_replies"][0]["prompt"] == question
    detail = await client.get(f"{API}/run/{body['trace_id']}", headers=alice["headers"])
    assert detail.status_code == 200
    # The detail is documented as its fields and again under `run`: each holds the input
    # and the open question once, and little else.
    assert len(detail.content) < 2 * (len(filler) + len(question)) + 4096
    assert detail.text.count(question) == 2 and detail.json()["run"]["pending_replies"][0]["prompt"] == question
    replied = await client.post(f"{API}/reply/{body['trace_id']}", headers=alice["headers"],
                                json={"content": "fine"})
    assert replied.status_code == 200, replied.text
    assert (await wait_for(client, alice, body["trace_id"], "succeeded", "failed"))["status"] == "succeeded"


async def test_the_output_limit_counts_utf8_bytes(client, alice, worker, fake_llm):
    """600 'é' are 600 characters (under 1,000) but 1,200 bytes: the step fails."""
    fake_llm.script_text("é" * 600, chunks=6)
    steps = [{"id": "say", "agent": {"worker": worker}, "prompt": "go"}]
    body = await run(client, alice, steps, "x")
    assert body["status"] == "failed", body
    assert f"passed the limit of {OUTPUT_LIMIT} bytes" in body["error"]
    assert "ORCHESTRA_STEP_OUTPUT_MAX_BYTES" in body["error"]
    fake_llm.script_text("é" * 450, chunks=6)  # 900 bytes: fits
    assert (await run(client, alice, steps, "y"))["status"] == "succeeded"


async def test_a_reply_larger_than_a_step_output_is_413_and_the_question_stays_open(client, alice):
    body = await run(client, alice, [human("h", "Name?")], "x", end=("waiting_reply",))
    url = f"{API}/reply/{body['trace_id']}"
    refused = await client.post(url, headers=alice["headers"], json={"content": "ü" * 600})
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"] == "PayloadTooLargeError"
    assert "ORCHESTRA_STEP_OUTPUT_MAX_BYTES" in refused.json()["message"]
    events = await stored_events(client, body["trace_id"])
    assert "reply_received" not in [e.kind for e in events]
    accepted = await client.post(url, headers=alice["headers"], json={"content": "ü" * 400})
    assert accepted.status_code == 200, accepted.text


async def test_an_ask_user_question_past_the_limit_is_refused_to_the_model(client, alice, worker, fake_llm):
    """The model's question is a prompt too: past the limit the tool answers an error and
    nothing is asked or stored twice."""
    fake_llm.script_tool_call("ask_user", {"question": "q" * 5000})
    fake_llm.script_text("I will not ask.")
    steps = [{"id": "a", "agent": {"worker": worker}, "prompt": "go"}]
    body = await run(client, alice, steps, "x")
    assert body["status"] == "succeeded", body
    events = await stored_events(client, body["trace_id"])
    assert "reply_requested" not in [e.kind for e in events]
    [result] = [e.data for e in events if e.kind == "tool_result"]
    assert "ORCHESTRA_PROMPT_MAX_BYTES" in result["error"]
    assert "ORCHESTRA_PROMPT_MAX_BYTES" in fake_llm.chat_requests[1]["messages"][-1]["content"]


SKIPPED_INNER = [{"id": "inner", "agent": {"human": True}, "prompt": "never asked", "when": "false"}]
OBJECT_INPUT = {"input_schema": {"type": "object"}}


async def start_object_run(client, who, steps, input, **extra) -> dict:
    template = await make_template(client, who, steps, name=f"t{next(_names)}", **OBJECT_INPUT, **extra)
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": template["template_id"], "input": input})
    assert started.status_code == 202, started.text
    return await wait_for(client, who, started.json()["trace_id"], "succeeded", "failed")


async def test_a_container_output_past_the_output_bound_fails_the_container(client, alice):
    """No model and no reply needed: a foreach of three items whose `output` is a 600-byte
    text each fits item by item, but the map's output (1,800 bytes) does not."""
    steps = [{"id": "each", "foreach": {"items": "input.list"}, "steps": SKIPPED_INNER,
              "output": "input.big"}]
    body = await start_object_run(client, alice, steps, {"list": [1, 2, 3], "big": "b" * 600})
    assert body["status"] == "failed", body
    assert "The output of step 'each' passed the limit of 1000 bytes" in body["error"]
    assert "ORCHESTRA_STEP_OUTPUT_MAX_BYTES" in body["error"]
    events = await stored_events(client, body["trace_id"])
    assert not any(e.kind == "step_finished" and e.data.get("path") == "each" for e in events)
    assert largest_event(events) < 2 * 1024
    rows = {s["path"]: s for s in body["steps"]}
    assert rows["each"]["status"] == "failed" and rows["each"]["output"] is None
    # an item past it fails as an item
    body = await start_object_run(client, alice, steps, {"list": [1], "big": "é" * 600})
    assert body["status"] == "failed" and "step 'each[0]'" in body["error"], body


async def test_the_run_output_past_the_output_bound_fails_the_run(client, alice):
    steps = [{"id": "only", "agent": {"human": True}, "prompt": "never asked", "when": "false"}]
    body = await start_object_run(client, alice, steps, {"big": "c" * 600}, output="[input.big, input.big]")
    assert body["status"] == "failed", body
    assert body["error"].startswith("The output of the template passed the limit of 1000 bytes")
    events = await stored_events(client, body["trace_id"])
    assert events[-1].kind == "run_failed" and largest_event(events) < 2 * 1024
