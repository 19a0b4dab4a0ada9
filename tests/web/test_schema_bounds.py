"""JSON Schema checks cannot freeze the server (issue 23, finding 1; SPEC §15).

A `pattern` such as `^(a+)+$` against `"a" * 27 + "!"` took seconds of backtracking on
the event loop (the violation was worded by Python's `re`). Every path that validates a
user's value — run input, a human step's `default` at check/save, a reply against an
`output_schema`, `propertyNames`/`patternProperties` — answers at once now, and a
pattern the linear engine cannot run is refused at save with its path.
"""

from __future__ import annotations

import time

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
