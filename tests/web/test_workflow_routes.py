"""`/api/v1/workflow` routes in process: statuses, bodies and what is stored."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import WorkflowRun, WorkflowTemplate
from tests.fakes.fake_llm import FakeLLM, fake_llm  # noqa: F401 - fixture

API = "/api/v1/workflow"


def assert_error(response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and isinstance(body["message"], str) and body["message"]
    return body


@pytest.fixture
async def alice(users):
    return await users.make("alice")


@pytest.fixture
async def worker(client, alice, fake_llm):
    from orchestra.services import agents, providers

    core = client.app.ctx.core
    provider = await providers.create_provider(
        core, name="fake", kind="openai_compatible", model_id="fake-model", api_key="k",
        base_url=fake_llm.base_url,
    )
    w = await agents.create_worker(core, owner_id=alice["user_id"], name="w", provider_id=provider.id,
                                   tools=["calculator"])
    return w.id


def human(sid="h", prompt="Your name for {{input}}?", depends_on=()):
    return {"id": sid, "agent": {"human": True}, "prompt": prompt, "depends_on": list(depends_on)}


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
    assert template["steps"] == [{**steps[0], "depends_on": []}]
    tid = template["template_id"]
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
