"""The contract to the letter (issue 39, point 8; SPEC §7, §15): a template reads back
with its worker's *name* in `agent.worker` — inner steps included, in every answer that
carries a template — so what one user (or install) exports saves for another, whose
workers of that name it then uses; saving by id keeps working. `on_tool_error` is a
step field beside `retry` and `on_error`; `tools.on_tool_error` stays as its alias."""

from __future__ import annotations

import pytest

from orchestra.db.models import WorkflowTemplate
from orchestra.services import agents

API = "/api/v1/workflow"


@pytest.fixture
async def workers(client, alice, users, make_worker):
    bob = await users.make("bob")
    return {"alice": alice, "bob": bob, "alice_w": await make_worker(alice, ["calculator"]),
            "bob_w": await make_worker(bob, [])}


def _steps(worker: str) -> list[dict]:
    return [
        {"id": "a", "agent": {"worker": worker}, "prompt": "Do {{input}}", "on_tool_error": "fail",
         "retry": {"max_attempts": 2, "backoff_seconds": 0}, "on_error": "continue"},
        {"id": "each", "foreach": {"items": "[1, 2]"}, "depends_on": ["a"],
         "steps": [{"id": "inner", "agent": {"worker": worker}, "prompt": "{{item}}"}]},
        {"id": "again", "depends_on": ["a"], "loop": {"max_iterations": 2, "until": "true", "steps": [
            {"id": "deep", "agent": {"worker": worker}, "prompt": "go", "tools": {"on_tool_error": "fail"}}]}},
    ]


def _workers_named(steps: list[dict]) -> list[str]:
    found = []
    for step in steps:
        if "agent" in step and "worker" in step["agent"]:
            found.append(step["agent"]["worker"])
        found += _workers_named(step.get("steps") or [])
        found += _workers_named((step.get("loop") or {}).get("steps") or [])
    return found


async def test_a_template_reads_back_with_worker_names_and_saves_elsewhere(client, workers):
    alice, bob = workers["alice"], workers["bob"]
    created = await client.post(f"{API}/template", headers=alice["headers"],
                                json={"name": "portable", "steps": _steps(workers["alice_w"])})  # by id
    assert created.status_code == 201, created.text
    template_id = created.json()["template_id"]
    assert _workers_named(created.json()["template"]["steps"]) == ["w", "w", "w"]
    got = (await client.get(f"{API}/template/{template_id}", headers=alice["headers"])).json()["template"]
    assert _workers_named(got["steps"]) == ["w", "w", "w"]
    listed = (await client.get(f"{API}/template", headers=alice["headers"])).json()["templates"]
    assert _workers_named(listed[0]["steps"]) == ["w", "w", "w"]
    version = (await client.get(f"{API}/template/{template_id}/versions/1", headers=alice["headers"])).json()
    assert _workers_named(version["version"]["steps"]) == ["w", "w", "w"]
    stored = await WorkflowTemplate.aget_by_id(template_id)
    assert _workers_named(stored.steps) == [workers["alice_w"]] * 3  # runs use the id

    exported = {k: got[k] for k in ("name", "description", "steps")}
    imported = await client.post(f"{API}/template", headers=bob["headers"], json=exported)
    assert imported.status_code == 201, imported.text
    assert _workers_named(imported.json()["template"]["steps"]) == ["w", "w", "w"]
    theirs = await WorkflowTemplate.aget_by_id(imported.json()["template_id"])
    assert _workers_named(theirs.steps) == [workers["bob_w"]] * 3  # bob's own worker named w

    await agents.update_worker(client.app.ctx.core, owner_id=alice["user_id"], worker_id=workers["alice_w"],
                               name="renamed")
    got = (await client.get(f"{API}/template/{template_id}", headers=alice["headers"])).json()["template"]
    assert _workers_named(got["steps"]) == ["renamed"] * 3  # the worker's current name


async def test_on_tool_error_is_a_step_field_and_tools_its_alias(client, workers):
    alice = workers["alice"]
    created = await client.post(f"{API}/template", headers=alice["headers"],
                                json={"name": "fields", "steps": _steps("w")})
    assert created.status_code == 201, created.text
    steps = created.json()["template"]["steps"]
    assert steps[0]["on_tool_error"] == "fail" and steps[0]["retry"] == {"max_attempts": 2, "backoff_seconds": 0}
    assert steps[2]["loop"]["steps"][0]["tools"] == {"on_tool_error": "fail"}  # the alias, as given
    wrong = await client.post(f"{API}/template/check", headers=alice["headers"], json={"name": "x", "steps": [
        {"id": "a", "agent": {"worker": "w"}, "prompt": "p", "on_tool_error": "explode"},
        {"id": "h", "http": {"method": "GET", "url": "https://example.com"}, "on_tool_error": "fail"}]})
    assert wrong.status_code == 200, wrong.text
    fields = {p["field"] for p in wrong.json()["problems"]}
    assert "steps.0.on_tool_error" in fields and "steps.1.on_tool_error" in fields, wrong.json()


async def test_a_runs_steps_name_their_worker_as_the_template_does(client, workers):
    """GET /workflow/run/{id}: each step's `agent.worker` is the worker's current name, as
    its template reads back; the run itself still uses the id."""
    alice = workers["alice"]
    created = await client.post(f"{API}/template", headers=alice["headers"],
                                json={"name": "named run", "steps": _steps(workers["alice_w"])})
    assert created.status_code == 201, created.text
    started = await client.post(f"{API}/run", headers=alice["headers"],
                                json={"template_id": created.json()["template_id"], "input": "x"})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    detail = (await client.get(f"{API}/run/{trace_id}", headers=alice["headers"])).json()
    named = {s["step_id"]: s["agent"]["worker"] for s in detail["steps"] if (s["agent"] or {}).get("worker")}
    assert named == {"a": "w"}, detail["steps"]
    assert detail["run"]["steps"] == detail["steps"]

    await agents.update_worker(client.app.ctx.core, owner_id=alice["user_id"], worker_id=workers["alice_w"],
                               name="renamed")
    detail = (await client.get(f"{API}/run/{trace_id}", headers=alice["headers"])).json()
    assert {s["agent"]["worker"] for s in detail["steps"] if (s["agent"] or {}).get("worker")} == {"renamed"}
