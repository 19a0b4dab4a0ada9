"""`/api/v1/workflow` routes in process: statuses, bodies and what is stored."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import WorkflowRun, WorkflowTemplate

API = "/api/v1/workflow"


def assert_error(response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and isinstance(body["message"], str) and body["message"]
    return body



@pytest.fixture
async def worker(alice, make_worker):
    return await make_worker(alice, ["calculator"])


def human(sid="h", prompt="Your name for {{input}}?", depends_on=(), **extra):
    return {"id": sid, "agent": {"human": True}, "prompt": prompt, "depends_on": list(depends_on), **extra}


async def make_template(client, who, steps, name="t", **extra):
    response = await client.post(f"{API}/template", headers=who["headers"],
                                 json={"name": name, "steps": steps, **extra})
    assert response.status_code == 201, response.text
    return response.json()


async def wait_for(client, who, trace_id, *statuses, timeout=10.0):
    for _ in range(int(timeout / 0.02)):
        body = (await client.get(f"{API}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in statuses:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"status stayed {body['status']}")


async def test_template_crud(client, alice, worker):
    steps = [{"id": "a", "agent": {"worker": worker}, "prompt": "Do {{input}}"}]
    created = await make_template(client, alice, steps, description="d")
    assert created["message"] == "success"
    template = created["template"]
    assert created["template_id"] == template["template_id"]
    assert template["name"] == "t" and template["shared"] is False and template["description"] == "d"
    # SPEC §7: it reads back with the worker's name, and stores the id (issue 39, point 8)
    assert template["steps"] == [{**steps[0], "agent": {"worker": "w"}, "depends_on": []}]
    tid = template["template_id"]
    assert (await WorkflowTemplate.aget_by_id(tid)).steps == [{**steps[0], "depends_on": []}]
    listed = (await client.get(f"{API}/template", headers=alice["headers"])).json()
    assert [t["template_id"] for t in listed["templates"]] == [tid]
    got = (await client.get(f"{API}/template/{tid}", headers=alice["headers"])).json()
    assert got["template"] == template
    put = await client.put(f"{API}/template/{tid}", headers=alice["headers"],
                           json={"name": "t2", "steps": [human()]})
    assert put.status_code == 200 and put.json()["template"]["name"] == "t2"
    stored = await WorkflowTemplate.aget(WorkflowTemplate.id == tid)
    assert stored.steps[0]["agent"] == {"human": True}
    deleted = await client.delete(f"{API}/template/{tid}", headers=alice["headers"])
    assert deleted.status_code == 200 and deleted.json()["message"] == "success"
    assert_error(await client.get(f"{API}/template/{tid}", headers=alice["headers"]), 404, "NotFoundError")


async def test_template_errors(client, alice, users, worker):
    bob = await users.make("bob")
    h = alice["headers"]
    assert_error(await client.post(f"{API}/template", json={"name": "x", "steps": [human()]}),
                 401, "AuthenticationRequiredError")
    assert_error(await client.post(f"{API}/template", headers=h, content=b"nope"), 400, "BadRequestError")
    assert_error(await client.post(f"{API}/template", headers=h, json={"name": "x"}), 422, "ValidationError")
    assert_error(await client.post(f"{API}/template", headers=h, json={"name": 5, "steps": [human()]}),
                 422, "ValidationError")
    body = assert_error(await client.post(f"{API}/template", headers=h, json={"name": "x", "steps": [
        human("a", depends_on=["b"]), human("b", depends_on=["a"])]}), 422, "ValidationError")
    assert "cycle" in body["message"] and "cycle" in body["detail"][0]["problem"]
    body = assert_error(await client.post(f"{API}/template", headers=h, json={"name": "x", "steps": [
        human("a", prompt="{{nope}}")]}), 422, "ValidationError")
    assert body["detail"] == [{"field": "steps.0.prompt", "problem": body["detail"][0]["problem"]}]
    assert "{{nope}}" in body["message"]
    body = assert_error(await client.post(f"{API}/template", headers=bob["headers"], json={
        "name": "x", "steps": [{"id": "a", "agent": {"worker": worker}, "prompt": "p"}]}), 422, "ValidationError")
    assert "unknown worker" in body["message"]
    assert_error(await client.post(f"{API}/template", headers=h, json={"name": "x", "steps": [human()],
                                                                      "shared": True}),
                 403, "PermissionDeniedError")
    await make_template(client, alice, [human()], name="dup")
    assert_error(await client.post(f"{API}/template", headers=h, json={"name": "DUP", "steps": [human()]}),
                 409, "ConflictError")
    mine = await make_template(client, alice, [human()], name="mine")
    tid = mine["template_id"]
    assert_error(await client.get(f"{API}/template/{tid}", headers=bob["headers"]), 404, "NotFoundError")
    assert_error(await client.delete(f"{API}/template/{tid}", headers=bob["headers"]), 404, "NotFoundError")
    assert_error(await client.patch(f"{API}/template/{tid}", headers=h, json={}), 405, "MethodNotAllowedError")


async def test_shared_template_is_visible_and_runnable_by_all(client, users):
    admin = await users.make("root", "ADMINISTRATOR")
    bob = await users.make("bob")
    shared = await make_template(client, admin, [human()], name="shared", shared=True)
    tid = shared["template_id"]
    assert shared["template"]["shared"] is True
    assert (await client.get(f"{API}/template/{tid}", headers=bob["headers"])).status_code == 200
    assert_error(await client.put(f"{API}/template/{tid}", headers=bob["headers"],
                                  json={"name": "mine", "steps": [human()]}), 403, "PermissionDeniedError")
    started = await client.post(f"{API}/run", headers=bob["headers"], json={"template_id": tid, "input": "x"})
    assert started.status_code == 202
    run = await WorkflowRun.aget(WorkflowRun.trace_id == started.json()["trace_id"])
    assert run.owner_id == bob["user_id"]


async def test_run_lifecycle_with_a_human_reply(client, alice, fake_llm, worker):
    fake_llm.script_text("Hello Ann!")
    steps = [human(), {"id": "greet", "agent": {"worker": worker}, "prompt": "Greet {{steps.h.output}}",
                       "depends_on": ["h"]}]
    tid = (await make_template(client, alice, steps))["template_id"]
    started = await client.post(f"{API}/run", headers=alice["headers"], json={"template_id": tid, "input": "cat"})
    assert started.status_code == 202
    body = started.json()
    assert body["message"] == "success" and body["status"] == "queued"
    trace_id = body["trace_id"]
    waiting = await wait_for(client, alice, trace_id, "waiting_reply")
    assert waiting["run"]["status"] == "waiting_reply"
    (pending,) = waiting["pending_replies"]
    assert pending["prompt"] == "Your name for cat?" and pending["step_id"] == "h"
    stale = await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"],
                              json={"content": "x", "request_id": "old"})
    assert_error(stale, 409, "ConflictError")
    replied = await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"],
                                json={"content": "Ann", "request_id": pending["request_id"]})
    assert replied.status_code == 200, replied.text
    assert replied.json() == {"message": "success", "trace_id": trace_id,
                              "request_id": pending["request_id"], "step_id": "h"}
    done = await wait_for(client, alice, trace_id, "succeeded", "failed")
    assert done["status"] == "succeeded" and done["finished_at"] and done["started_at"]
    outputs = {s["step_id"]: (s["status"], s["output"]) for s in done["steps"]}
    assert outputs == {"h": ("succeeded", "Ann"), "greet": ("succeeded", "Hello Ann!")}
    greet = done["steps"][1]
    assert greet["usage"]["completion_tokens"] >= 1 and greet["started_at"] <= greet["finished_at"]
    assert_error(await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"], json={"content": "x"}),
                 409, "ConflictError")
    assert_error(await client.post(f"{API}/cancel/{trace_id}", headers=alice["headers"]), 409, "ConflictError")
    listed = (await client.get(f"{API}/run", headers=alice["headers"])).json()["runs"]
    assert [r["trace_id"] for r in listed] == [trace_id] and listed[0]["status"] == "succeeded"
    events = (await client.get(f"{API}/run/{trace_id}/events?after=2", headers=alice["headers"])).json()
    assert events["events"][0]["seq"] == 3 and events["events"][-1]["kind"] == "run_finished"


async def test_run_errors(client, alice, users):
    bob = await users.make("bob")
    h = alice["headers"]
    assert_error(await client.post(f"{API}/run", headers=h, json={"template_id": "nope"}), 404, "NotFoundError")
    assert_error(await client.post(f"{API}/run", headers=h, json={"input": "x"}), 422, "ValidationError")
    assert_error(await client.post(f"{API}/run", headers=h, json=[1]), 400, "BadRequestError")
    tid = (await make_template(client, alice, [human()]))["template_id"]
    assert_error(await client.post(f"{API}/run", headers=h, json={"template_id": tid, "files": ["zz"]}),
                 422, "ValidationError")
    trace_id = (await client.post(f"{API}/run", headers=h, json={"template_id": tid})).json()["trace_id"]
    await wait_for(client, alice, trace_id, "waiting_reply")
    for method, path in (("get", f"/run/{trace_id}"), ("post", f"/cancel/{trace_id}"),
                         ("get", f"/sse/{trace_id}")):
        assert_error(await getattr(client, method)(API + path, headers=bob["headers"]), 404, "NotFoundError")
    assert_error(await client.post(f"{API}/reply/{trace_id}", headers=bob["headers"], json={"content": "x"}),
                 404, "NotFoundError")
    assert_error(await client.post(f"{API}/reply/unknown", headers=h, json={"content": "x"}), 404, "NotFoundError")
    assert_error(await client.post(f"{API}/reply/{trace_id}", headers=h, json={"content": 3}), 422, "ValidationError")
    assert_error(await client.get(f"{API}/run?all=1", headers=h), 403, "PermissionDeniedError")
    assert_error(await client.get(f"{API}/run?limit=0", headers=h), 422, "ValidationError")
    cancelled = await client.post(f"{API}/cancel/{trace_id}", headers=h)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert (await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)).status == "cancelled"
    assert_error(await client.post(f"{API}/reply/{trace_id}", headers=h, json={"content": "x"}), 409, "ConflictError")


async def test_admin_may_list_all_and_answer_any_run(client, alice, users):
    admin = await users.make("root", "ADMINISTRATOR")
    tid = (await make_template(client, alice, [human()]))["template_id"]
    trace_id = (await client.post(f"{API}/run", headers=alice["headers"], json={"template_id": tid})).json()["trace_id"]
    await wait_for(client, alice, trace_id, "waiting_reply")
    everyone = (await client.get(f"{API}/run?all=1", headers=admin["headers"])).json()["runs"]
    assert trace_id in [r["trace_id"] for r in everyone]
    assert (await client.post(f"{API}/reply/{trace_id}", headers=admin["headers"], json={"content": "ok"})).status_code == 200
    await wait_for(client, alice, trace_id, "succeeded")


# --- the workflow language (SPEC §7): save-time checks and input_schema -----------------

TOPICS = {"type": "object", "required": ["topics"],
          "properties": {"topics": {"type": "array", "items": {"type": "string"}}}}


async def test_language_fields_round_trip(client, alice):
    steps = [
        human("review", output_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
              timeout_seconds=30, default={"ok": False}),
        {**human("ship", "Ship {{ steps.review.output }}", ["review"]),
         "when": "steps.review.output.ok", "retry": {"max_attempts": 2, "backoff_seconds": 0.5},
         "on_error": "continue"},
    ]
    created = await make_template(client, alice, steps, input_schema=TOPICS,
                                  limits={"deadline_seconds": 60}, output="steps.ship.output")
    template = created["template"]
    assert template["steps"][1]["when"] == "steps.review.output.ok"
    assert template["steps"][0]["default"] == {"ok": False}
    assert (template["input_schema"], template["limits"], template["output"]) == (
        TOPICS, {"deadline_seconds": 60}, "steps.ship.output")
    stored = await WorkflowTemplate.aget(WorkflowTemplate.id == created["template_id"])
    assert stored.spec == {"input_schema": TOPICS, "limits": {"deadline_seconds": 60},
                           "output": "steps.ship.output"}
    assert stored.steps[1]["retry"] == {"max_attempts": 2, "backoff_seconds": 0.5}


async def test_language_problems_are_one_422_with_paths(client, alice):
    body = {"name": "bad", "steps": [
        human("a", when="steps.b.output"),
        human("b", "{{ steps.a.output.( }}", ["a"], output_schema={"$ref": "https://x.example/s"}),
    ], "input_schema": {"type": "nope"}}
    response = await client.post(f"{API}/template", headers=alice["headers"], json=body)
    detail = assert_error(response, 422, "ValidationError")["detail"]
    where = {d["field"] for d in detail}
    assert {"steps.0.when", "steps.1.prompt", "steps.1.output_schema.$ref", "input_schema.type"} <= where
    assert await WorkflowTemplate.aget_or_none(WorkflowTemplate.name == "bad") is None


async def test_check_route_lists_problems_and_stores_nothing(client, alice):
    body = {"name": "chk", "steps": [human("a", when="colour == 1"), human("b", depends_on=["a", "zz"])]}
    response = await client.post(f"{API}/template/check", headers=alice["headers"], json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["message"] == "success" and answer["valid"] is False
    assert {"field": "steps.1.depends_on", "problem": "unknown step 'zz'"} in answer["problems"]
    assert any(p["field"] == "steps.0.when" and "unknown variable 'colour'" in p["problem"]
               for p in answer["problems"])
    good = await client.post(f"{API}/template/check", headers=alice["headers"],
                             json={"name": "chk", "steps": [human("a")]})
    assert good.json() == {"message": "success", "valid": True, "problems": []}
    assert await WorkflowTemplate.aget_or_none(WorkflowTemplate.name == "chk") is None


async def test_input_schema_validates_run_input(client, alice):
    created = await make_template(client, alice, [human("h", "Topics: {{ input.topics }}")],
                                  input_schema=TOPICS)
    tid = created["template_id"]
    response = await client.post(f"{API}/run", headers=alice["headers"],
                                 json={"template_id": tid, "input": {"topics": ["a", "b", 3]}})
    body = assert_error(response, 422, "ValidationError")
    assert body["detail"] == [{"field": "input.topics.2", "problem": '3 is not of type "string"'}]
    response = await client.post(f"{API}/run", headers=alice["headers"],
                                 json={"template_id": tid, "input": "just text"})
    assert assert_error(response, 422, "ValidationError")["detail"][0]["field"] == "input"
    assert await WorkflowRun.aget_or_none(WorkflowRun.template == tid) is None
    response = await client.post(f"{API}/run", headers=alice["headers"],
                                 json={"template_id": tid, "input": {"topics": ["a", "b"]}})
    assert response.status_code == 202, response.text
    trace_id = response.json()["trace_id"]
    run = await wait_for(client, alice, trace_id, "waiting_reply")
    assert run["input"] == {"topics": ["a", "b"]}
    assert run["pending_replies"][0]["prompt"] == 'Topics: ["a","b"]'
    stored = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    assert stored.input_value == {"topics": ["a", "b"]}


async def test_v1_run_input_must_stay_text(client, alice):
    created = await make_template(client, alice, [human("h")])
    response = await client.post(f"{API}/run", headers=alice["headers"],
                                 json={"template_id": created["template_id"], "input": {"a": 1}})
    assert assert_error(response, 422, "ValidationError")["detail"] == [
        {"field": "input", "problem": "must be a string (this template has no input_schema)"}]


async def test_structured_human_reply_and_run_retry_routes(client, alice, users):
    schema = {"type": "object", "required": ["approved"], "properties": {"approved": {"type": "boolean"}}}
    created = await make_template(client, alice, [human("ok", "Approve {{input}}?", output_schema=schema)])
    started = await client.post(f"{API}/run", headers=alice["headers"],
                                json={"template_id": created["template_id"], "input": "the plan"})
    trace_id = started.json()["trace_id"]
    await wait_for(client, alice, trace_id, "waiting_reply")
    wrong = await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"],
                              json={"content": {"approved": "sure"}})
    assert assert_error(wrong, 422, "ValidationError")["detail"] == [
        {"field": "content.approved", "problem": '"sure" is not of type "boolean"'}]
    running = await client.post(f"{API}/run/{trace_id}/retry", headers=alice["headers"])
    assert_error(running, 409, "ConflictError")  # it has not ended
    cancelled = await client.post(f"{API}/cancel/{trace_id}", headers=alice["headers"])
    assert cancelled.status_code == 200
    await wait_for(client, alice, trace_id, "cancelled")
    retried = await client.post(f"{API}/run/{trace_id}/retry", headers=alice["headers"], json={})
    assert retried.status_code == 202, retried.text
    body = retried.json()
    assert body["message"] == "success" and body["status"] == "queued" and body["retry_of"] == trace_id
    new_id = body["trace_id"]
    run = await wait_for(client, alice, new_id, "waiting_reply")
    assert run["retry_of"] == trace_id and run["steps"][0]["reused"] is False
    answered = await client.post(f"{API}/reply/{new_id}", headers=alice["headers"],
                                 json={"content": {"approved": True}})
    assert answered.status_code == 200, answered.text
    done = await wait_for(client, alice, new_id, "succeeded")
    assert done["steps"][0]["output"] == {"approved": True} and done["steps"][0]["path"] == "ok"
    again = await client.post(f"{API}/run/{new_id}/retry", headers=alice["headers"])
    assert_error(again, 409, "ConflictError")  # it succeeded
    bob = await users.make("bob")
    assert_error(await client.post(f"{API}/run/{trace_id}/retry", headers=bob["headers"]), 404, "NotFoundError")
    bad = await client.post(f"{API}/run/{trace_id}/retry", headers=alice["headers"], json={"from_step": "zz"})
    assert assert_error(bad, 422, "ValidationError")["detail"][0]["field"] == "from_step"


async def test_a_template_names_a_worker_by_name(client, alice, users, worker):
    """Issue 29, item 4: `{"worker": "w"}` (a name, any case) is resolved to the worker's id
    when saved, inner steps included; an unknown name lists the names there are; another
    user's worker name is not resolved."""
    steps = [{"id": "a", "agent": {"worker": "W"}, "prompt": "p"},
             {"id": "each", "foreach": {"items": "['x', 'y']"}, "depends_on": ["a"],
              "agent": {"worker": "w"}, "prompt": "{{item}}"}]
    saved = await make_template(client, alice, steps)
    # read back by the worker's own name (SPEC §7), stored by its id
    assert [s["agent"] for s in saved["template"]["steps"]] == [{"worker": "w"}, {"worker": "w"}]
    stored = await WorkflowTemplate.aget_by_id(saved["template_id"])
    assert [s["agent"] for s in stored.steps] == [{"worker": worker}, {"worker": worker}]
    wrong = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "t2", "steps": [{"id": "a", "agent": {"worker": "plain"}, "prompt": "p"}]})
    body = assert_error(wrong, 422, "ValidationError")
    (problem,) = [d for d in body["detail"] if d["field"] == "steps.0.agent.worker"]
    assert "unknown worker 'plain'" in problem["problem"] and "(yours: w)" in problem["problem"]
    bob = await users.make("bob")
    theirs = await client.post(f"{API}/template", headers=bob["headers"], json={
        "name": "t3", "steps": [{"id": "a", "agent": {"worker": "w"}, "prompt": "p"}]})
    assert "(yours: none yet)" in assert_error(theirs, 422, "ValidationError")["detail"][0]["problem"]


async def test_an_expression_that_mixes_types_is_refused_at_save(client, alice):
    """Issue 29, item 9: `urgency >= '4'` compares the output_schema's integer with a string;
    it failed at run time only. Now `template check` and saves name it; the right spelling,
    equality across types, optional fields and comprehensions are passed."""
    classify = {"id": "classify", "agent": {"human": True}, "prompt": "Classify",
                "output_schema": {"type": "object", "required": ["urgency"], "properties": {
                    "urgency": {"type": "integer"}, "note": {"type": "string"}}}}

    def template(when: str) -> dict:
        return {"name": "typed", "steps": [classify, {"id": "escalate", "agent": {"human": True}, "prompt": "Now?",
                                                      "depends_on": ["classify"], "when": when}]}

    checked = await client.post(f"{API}/template/check", headers=alice["headers"],
                                json=template("steps.classify.output.urgency >= '4'"))
    assert checked.status_code == 200, checked.text
    body = checked.json()
    assert body["valid"] is False
    (problem,) = body["problems"]
    assert problem["field"] == "steps.1.when" and "e.g. 4 not '4'" in problem["problem"]
    refused = await client.post(f"{API}/template", headers=alice["headers"],
                                json=template("steps.classify.output.urgency >= '4'"))
    assert_error(refused, 422, "ValidationError")
    assert await WorkflowTemplate.aget_or_none(WorkflowTemplate.name == "typed") is None
    for fine in ("steps.classify.output.urgency >= 4", "steps.classify.output.urgency == '4'",
                 "steps.classify.output.note.size() > 2", "[1, 2].exists(x, x == steps.classify.output.urgency)"):
        answer = await client.post(f"{API}/template/check", headers=alice["headers"], json=template(fine))
        assert answer.json()["valid"] is True, (fine, answer.text)


# --- template output_schema and expose (SPEC §14) ------------------------------------------


async def test_output_schema_and_expose_are_saved_checked_and_enforced(client, alice):
    bad = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "bad", "steps": [human("a")], "output_schema": {"type": "nope"}})
    assert "output_schema.type" in {d["field"] for d in assert_error(bad, 422, "ValidationError")["detail"]}
    bad = await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "bad", "steps": [human("a")], "expose": {"mcp": True, "rest": True}})
    assert "expose.rest" in {d["field"] for d in assert_error(bad, 422, "ValidationError")["detail"]}
    assert await WorkflowTemplate.aget_or_none(WorkflowTemplate.name == "bad") is None
    created = await make_template(client, alice, [human("a")], output="steps.a.output",
                                  output_schema={"type": "string", "maxLength": 3}, expose={"mcp": True})
    assert created["template"]["expose"] == {"mcp": True}
    assert created["template"]["output_schema"] == {"type": "string", "maxLength": 3}
    stored = await WorkflowTemplate.aget(WorkflowTemplate.id == created["template_id"])
    assert stored.spec == {"output": "steps.a.output", "output_schema": {"type": "string", "maxLength": 3},
                           "expose": {"mcp": True}}
    hidden = await make_template(client, alice, [human("a")], name="hidden", expose={"mcp": False})
    assert "expose" not in hidden["template"]  # false is the default: not stored

    async def run_with(reply: str) -> dict:
        started = await client.post(f"{API}/run", headers=alice["headers"],
                                    json={"template_id": created["template_id"], "input": "x"})
        trace_id = started.json()["trace_id"]
        await wait_for(client, alice, trace_id, "waiting_reply")
        await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"], json={"content": reply})
        return await wait_for(client, alice, trace_id, "succeeded", "failed")

    assert (await run_with("ok"))["status"] == "succeeded"
    failed = await run_with("too long")
    assert failed["status"] == "failed"
    assert "output_schema" in failed["error"] and "output" in failed["error"]
