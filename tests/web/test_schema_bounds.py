"""JSON Schema checks cannot freeze the server (issue 23, finding 1; SPEC §15).

A `pattern` such as `^(a+)+$` against `"a" * 27 + "!"` took seconds of backtracking on
the event loop (the violation was worded by Python's `re`). Every path that validates a
user's value — run input, a human step's `default` at check/save, a reply against an
`output_schema`, `propertyNames`/`patternProperties` — answers at once now, and a
pattern the linear engine cannot run is refused at save with its path.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestra.db.models import WorkflowRun, WorkflowTemplate
from tests.web.test_workflow_routes import API, assert_error, human, make_template, wait_for

EVIL = "^(a+)+$"
HOSTILE = "a" * 27 + "!"  # Python's re: ~6 s of backtracking; each 2 more characters x4


async def timed(call):
    began = time.perf_counter()
    response = await call
    return response, time.perf_counter() - began


async def test_a_backtracking_pattern_answers_at_once_on_start(client, users):
    alice = await users.make("alice")
    created = await make_template(client, alice, [human("h", "Name {{ input }}")],
                                  input_schema={"type": "string", "pattern": EVIL})
    response, took = await timed(client.post(f"{API}/run", headers=alice["headers"],
                                              json={"template_id": created["template_id"], "input": HOSTILE}))
    body = assert_error(response, 422, "ValidationError")
    assert body["detail"] == [{"field": "input", "problem": f'"{HOSTILE}" does not match "{EVIL}"'}]
    assert took < 1.0, took
    assert await WorkflowRun.aget_or_none(WorkflowRun.template == created["template_id"]) is None
    keyed = await make_template(client, alice, [human("h")], name="keys", input_schema={
        "type": "object", "propertyNames": {"pattern": EVIL},
        "patternProperties": {EVIL: {"type": "integer"}}})
    response, took = await timed(client.post(f"{API}/run", headers=alice["headers"], json={
        "template_id": keyed["template_id"], "input": {HOSTILE: 1, "a" * 30: "x"}}))
    detail = assert_error(response, 422, "ValidationError")["detail"]
    assert took < 1.0, took
    assert {"field": "input", "problem": f'"{HOSTILE}" does not match "{EVIL}"'} in detail
    assert {"field": "input." + "a" * 30, "problem": '"x" is not of type "integer"'} in detail


async def test_a_backtracking_pattern_answers_at_once_on_check_and_reply(client, users):
    alice = await users.make("alice")
    schema = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "pattern": EVIL}}}
    step = human("h", timeout_seconds=60, output_schema=schema, default={"name": HOSTILE})
    response, took = await timed(client.post(f"{API}/template/check", headers=alice["headers"],
                                             json={"name": "t", "steps": [step]}))
    assert response.status_code == 200, response.text
    assert response.json()["problems"] == [{"field": "steps.0.default.name",
                                            "problem": f'does not match output_schema: "{HOSTILE}" does not match "{EVIL}"'}]
    assert took < 1.0, took
    created = await make_template(client, alice, [human("h", "Name {{ input }}?", output_schema=schema)])
    started = await client.post(f"{API}/run", headers=alice["headers"],
                                json={"template_id": created["template_id"], "input": "x"})
    trace_id = started.json()["trace_id"]
    await wait_for(client, alice, trace_id, "waiting_reply")
    response, took = await timed(client.post(f"{API}/reply/{trace_id}", headers=alice["headers"],
                                             json={"content": {"name": HOSTILE}}))
    assert assert_error(response, 422, "ValidationError")["detail"] == [
        {"field": "content.name", "problem": f'"{HOSTILE}" does not match "{EVIL}"'}]
    assert took < 1.0, took
    assert (await wait_for(client, alice, trace_id, "waiting_reply"))["pending_replies"]  # still open


async def test_patterns_that_need_backtracking_are_refused_at_save_with_their_path(client, users):
    alice = await users.make("alice")
    schema = {"type": "object",
              "properties": {"a": {"type": "string", "pattern": r"^(\w)\1$"}},
              "patternProperties": {"(?<=x)y": {}},
              "propertyNames": {"pattern": "^(?!tmp)"}}
    response = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "refs", "steps": [human("h", output_schema=schema)], "input_schema": {"pattern": r"(a)\1"}})
    detail = assert_error(response, 422, "ValidationError")["detail"]
    fields = {d["field"] for d in detail}
    assert "input_schema.pattern" in fields
    assert fields & {"steps.0.output_schema.properties.a.pattern",
                     "steps.0.output_schema.patternProperties.(?<=x)y",
                     "steps.0.output_schema.propertyNames.pattern"}
    assert all("cannot backtrack" in d["problem"] for d in detail), detail
    assert await WorkflowTemplate.aget_or_none(WorkflowTemplate.name == "refs") is None
    for path, sub in [("properties.a.pattern", {"properties": {"a": {"pattern": r"^(\w)\1$"}}}),
                      ("patternProperties.(?<=x)y", {"patternProperties": {"(?<=x)y": {}}}),
                      ("propertyNames.pattern", {"propertyNames": {"pattern": "^(?!tmp)"}})]:
        response = await client.post(f"{API}/template", headers=alice["headers"], json={
            "name": "one", "steps": [human("h")], "input_schema": sub})
        detail = assert_error(response, 422, "ValidationError")["detail"]
        assert [d["field"] for d in detail] == [f"input_schema.{path}"], detail


class LoopLag:
    """The longest the event loop was held while the block ran (a 5 ms ticker's lateness)."""

    async def __aenter__(self):
        self.worst = 0.0

        async def tick():
            while True:
                began = time.perf_counter()
                await asyncio.sleep(0.005)
                self.worst = max(self.worst, time.perf_counter() - began - 0.005)

        self.task = asyncio.get_running_loop().create_task(tick())
        return self

    async def __aexit__(self, *exc):
        self.task.cancel()


WIDE = {"type": "array", "items": {"allOf": [{"type": "integer", "minimum": 0}] * 2000}}
MANY = {"type": "array", "items": {"allOf": [{"type": "string"}] * 300}}


@pytest.fixture
def settings_overrides() -> dict:
    return {"schema_timeout_ms": 300}


async def test_checks_too_large_for_the_event_loop_run_bounded_elsewhere(client, users):
    """A large value against a large schema (2,000 subschemas x 100,000 items: seconds of
    work, on the event loop before) is checked in a worker under ORCHESTRA_SCHEMA_TIMEOUT_MS;
    a value with very many violations gets its first one at once (300,000 violations
    took ~8 s to list)."""
    alice = await users.make("alice")
    wide = await make_template(client, alice, [human("h")], name="wide", input_schema=WIDE)
    async with LoopLag() as lag:
        response, took = await timed(client.post(f"{API}/run", headers=alice["headers"], json={
            "template_id": wide["template_id"], "input": [1] * 100_000}))
    detail = assert_error(response, 422, "ValidationError")["detail"]
    assert detail == [{"field": "input", "problem": "could not be checked against the schema within "
                                                    "300 ms, the limit (ORCHESTRA_SCHEMA_TIMEOUT_MS)"}]
    assert took < 3.0 and lag.worst < 0.25, (took, lag.worst)
    assert await WorkflowRun.aget_or_none(WorkflowRun.template == wide["template_id"]) is None
    many = await make_template(client, alice, [human("h")], name="many", input_schema=MANY)
    async with LoopLag() as lag:
        response, took = await timed(client.post(f"{API}/run", headers=alice["headers"], json={
            "template_id": many["template_id"], "input": [1] * 1000}))
    assert assert_error(response, 422, "ValidationError")["detail"] == [
        {"field": "input.0", "problem": '1 is not of type "string"'}]
    assert took < 1.0 and lag.worst < 0.25, (took, lag.worst)
    small = await client.post(f"{API}/run", headers=alice["headers"], json={
        "template_id": wide["template_id"], "input": [1, 2, 3]})  # small: checked inline, fine
    assert small.status_code == 202, small.text


async def test_a_reply_too_large_for_the_event_loop_is_checked_bounded_and_the_question_stays_open(
        client, users):
    alice = await users.make("alice")
    created = await make_template(client, alice, [human("h", "List?", output_schema=WIDE)])
    started = await client.post(f"{API}/run", headers=alice["headers"],
                                json={"template_id": created["template_id"], "input": "x"})
    trace_id = started.json()["trace_id"]
    await wait_for(client, alice, trace_id, "waiting_reply")
    async with LoopLag() as lag:
        response, took = await timed(client.post(f"{API}/reply/{trace_id}", headers=alice["headers"],
                                                 json={"content": [1] * 100_000}))
    assert assert_error(response, 422, "ValidationError")["detail"][0]["problem"].endswith(
        "(ORCHESTRA_SCHEMA_TIMEOUT_MS)")
    assert took < 3.0 and lag.worst < 0.25, (took, lag.worst)
    assert (await wait_for(client, alice, trace_id, "waiting_reply"))["pending_replies"]
    fits = await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"], json={"content": [1, 2]})
    assert fits.status_code == 200, fits.text
    assert (await wait_for(client, alice, trace_id, "succeeded"))["steps"][0]["output"] == [1, 2]


async def test_refs_that_expand_exponentially_are_refused_at_save(client, users):
    alice = await users.make("alice")
    defs = {"d0": {"type": "integer"}}
    for i in range(1, 40):
        defs[f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]}
    response = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "expo", "steps": [human("h")], "input_schema": {"$defs": defs, "$ref": "#/$defs/d39"}})
    detail = assert_error(response, 422, "ValidationError")["detail"]
    assert [d["field"] for d in detail] == ["input_schema"]
    assert detail[0]["problem"].startswith("has $refs that expand to ")
    assert detail[0]["problem"].endswith(" subschemas; at most 100,000 may apply to one value")
    tree = {"$defs": {"n": {"type": "object", "properties": {"c": {"items": {"$ref": "#/$defs/n"}}}}},
            "$ref": "#/$defs/n"}  # recursion follows the value down: allowed
    await make_template(client, alice, [human("h")], name="tree", input_schema=tree)
