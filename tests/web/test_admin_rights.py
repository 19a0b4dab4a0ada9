"""Administrators' rights over other users' work (SPEC §15), with real tokens of three
users: the owner (USER), an ADMINISTRATOR and a SUPER_ADMINISTRATOR, plus another USER.

Administrators may read, answer, cancel and retry any user's run; the retried run
belongs to the run's owner. They cannot read other users' private templates, workers or
files, and a plain user can do none of it.
"""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import WorkflowRun

API = "/api/v1"
WF = f"{API}/workflow"


def assert_error(response, status: int, error: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == error


@pytest.fixture
async def people(users):
    return {
        "owner": await users.make("owner"),
        "admin": await users.make("admin", "ADMINISTRATOR"),
        "root": await users.make("root", "SUPER_ADMINISTRATOR"),
        "other": await users.make("other"),
    }


async def status_of(client, who, trace_id: str, *wanted: str, timeout: float = 10.0) -> dict:
    for _ in range(int(timeout / 0.02)):
        body = (await client.get(f"{WF}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in wanted:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"{trace_id} stayed {body['status']}")


async def waiting_run(client, owner, template_id: str) -> str:
    started = await client.post(f"{WF}/run", headers=owner["headers"],
                                json={"template_id": template_id, "input": "x"})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    await status_of(client, owner, trace_id, "waiting_reply")
    return trace_id


@pytest.fixture
async def template_id(client, people):
    steps = [{"id": "ask", "agent": {"human": True}, "prompt": "Name for {{input}}?"}]
    made = await client.post(f"{WF}/template", headers=people["owner"]["headers"],
                             json={"name": "private", "steps": steps})
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


@pytest.mark.parametrize("role", ["admin", "root"])
async def test_administrators_read_answer_cancel_and_retry_any_run(client, people, template_id, role):
    owner, admin = people["owner"], people[role]

    # read: the run, its events, its stream's stored log, and the list of everyone's runs
    answered = await waiting_run(client, owner, template_id)
    assert (await client.get(f"{WF}/run/{answered}", headers=admin["headers"])).status_code == 200
    events = await client.get(f"{WF}/run/{answered}/events", headers=admin["headers"])
    assert events.status_code == 200 and events.json()["events"]
    everyone = (await client.get(f"{WF}/run?all=1", headers=admin["headers"])).json()["runs"]
    assert answered in {r["trace_id"] for r in everyone}

    # answer
    reply = await client.post(f"{WF}/reply/{answered}", headers=admin["headers"], json={"content": "Ada"})
    assert reply.status_code == 200, reply.text
    await status_of(client, owner, answered, "succeeded")

    # cancel
    cancelled = await waiting_run(client, owner, template_id)
    answer = await client.post(f"{WF}/cancel/{cancelled}", headers=admin["headers"])
    assert answer.status_code == 200, answer.text
    assert (await WorkflowRun.aget(WorkflowRun.trace_id == cancelled)).status == "cancelled"

    # retry: the new run is the owner's, not the administrator's
    retried = await client.post(f"{WF}/run/{cancelled}/retry", headers=admin["headers"], json={})
    assert retried.status_code == 202, retried.text
    new_id = retried.json()["trace_id"]
    assert retried.json()["retry_of"] == cancelled
    assert (await WorkflowRun.aget(WorkflowRun.trace_id == new_id)).owner_id == owner["user_id"]
    mine = (await client.get(f"{WF}/run", headers=owner["headers"])).json()["runs"]
    assert new_id in {r["trace_id"] for r in mine}
    theirs = (await client.get(f"{WF}/run", headers=admin["headers"])).json()["runs"]
    assert new_id not in {r["trace_id"] for r in theirs}
    await status_of(client, owner, new_id, "waiting_reply")


@pytest.mark.parametrize("role", ["admin", "root"])
async def test_administrators_cannot_read_other_users_templates_workers_or_files(
    client, people, template_id, role
):
    owner, admin = people["owner"], people[role]
    from orchestra.services import agents, providers

    core = client.app.ctx.core
    provider = await providers.create_provider(
        core, name="p", kind="openai_compatible", model_id="m", api_key="k",
        base_url="http://127.0.0.1:9/v1",
    )
    worker = await agents.create_worker(core, owner_id=owner["user_id"], name="w",
                                        provider_id=provider.id, tools=[])
    upload = await client.post(f"{API}/adapter/client/upload", headers=owner["headers"],
                               files=[("file", ("secret.txt", b"owner's only", "text/plain"))])
    file_id = upload.json()["files"][0]["file_id"]

    h = admin["headers"]
    assert_error(await client.get(f"{WF}/template/{template_id}", headers=h), 404, "NotFoundError")
    listed = (await client.get(f"{WF}/template", headers=h)).json()["templates"]
    assert template_id not in {t["template_id"] for t in listed}
    assert_error(await client.put(f"{WF}/template/{template_id}", headers=h,
                                  json={"name": "mine now", "steps": []}), 404, "NotFoundError")
    assert_error(await client.delete(f"{WF}/template/{template_id}", headers=h), 404, "NotFoundError")
    started = await client.post(f"{WF}/run", headers=h, json={"template_id": template_id, "input": "x"})
    assert_error(started, 404, "NotFoundError")

    assert_error(await client.get(f"{API}/agent/worker/{worker.id}", headers=h), 404, "NotFoundError")
    workers = (await client.get(f"{API}/agent/worker", headers=h)).json()["workers"]
    assert worker.id not in {w.get("worker_id") for w in workers}

    assert_error(await client.get(f"{API}/adapter/client/upload/{file_id}", headers=h), 404, "NotFoundError")
    assert_error(await client.delete(f"{API}/adapter/client/upload/{file_id}", headers=h), 404, "NotFoundError")
    files = (await client.get(f"{API}/adapter/client/upload", headers=h)).json()["files"]
    assert files == []
    # The owner still has all of it.
    assert (await client.get(f"{WF}/template/{template_id}", headers=owner["headers"])).status_code == 200
    assert (await client.get(f"{API}/adapter/client/upload/{file_id}", headers=owner["headers"])).status_code == 200


async def test_a_plain_user_can_do_none_of_it(client, people, template_id):
    owner, other = people["owner"], people["other"]
    trace_id = await waiting_run(client, owner, template_id)
    h = other["headers"]
    assert_error(await client.get(f"{WF}/run/{trace_id}", headers=h), 404, "NotFoundError")
    assert_error(await client.get(f"{WF}/run/{trace_id}/events", headers=h), 404, "NotFoundError")
    assert_error(await client.get(f"{WF}/run?all=1", headers=h), 403, "PermissionDeniedError")
    assert_error(await client.post(f"{WF}/reply/{trace_id}", headers=h, json={"content": "no"}),
                 404, "NotFoundError")
    assert_error(await client.post(f"{WF}/cancel/{trace_id}", headers=h), 404, "NotFoundError")
    assert (await client.post(f"{WF}/cancel/{trace_id}", headers=owner["headers"])).status_code == 200
    assert_error(await client.post(f"{WF}/run/{trace_id}/retry", headers=h, json={}), 404, "NotFoundError")
    assert (await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)).status == "cancelled"
    retries = WorkflowRun.select().where(WorkflowRun.retry_of == trace_id)
    assert await client.app.ctx.core.db.count(retries) == 0
