"""`Idempotency-Key` on `POST /run` (SPEC §11), in process on SQLite and PostgreSQL: the
same user and key answer the first run with 200 and start nothing; another body is 422
naming the header; concurrent duplicates start one run; the key is the user's own."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.access_models import RunStartKey
from orchestra.db.models import WorkflowRun

WF = "/api/v1/workflow"


@pytest.fixture
def database_url(both_stores):
    return both_stores


async def template(client, who) -> str:
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "Name for {{input}}?"}]
    response = await client.post(f"{WF}/template", headers=who["headers"], json={"name": "t", "steps": steps})
    assert response.status_code == 201, response.text
    return response.json()["template_id"]


async def runs(client) -> int:
    return await client.app.ctx.core.db.count(WorkflowRun.select())


async def test_a_repeated_key_answers_the_first_run_and_starts_nothing(client, alice):
    tid = await template(client, alice)
    headers = {**alice["headers"], "Idempotency-Key": "order-42"}
    first = await client.post(f"{WF}/run", headers=headers, json={"template_id": tid, "input": "x"})
    assert first.status_code == 202, first.text
    assert "idempotent-replayed" not in first.headers
    again = await client.post(f"{WF}/run", headers=headers, json={"template_id": tid, "input": "x"})
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["trace_id"] == first.json()["trace_id"] and again.json()["message"] == "success"
    assert await runs(client) == 1
    other = await client.post(f"{WF}/run", headers=headers, json={"template_id": tid, "input": "y"})
    assert other.status_code == 422, other.text
    assert other.json()["error"] == "ValidationError"
    assert other.json()["detail"][0]["field"] == "Idempotency-Key"
    assert await runs(client) == 1
    # another key, or no key, starts another run
    fresh = await client.post(f"{WF}/run", headers={**alice["headers"], "Idempotency-Key": "order-43"},
                              json={"template_id": tid, "input": "x"})
    assert fresh.status_code == 202 and fresh.json()["trace_id"] != first.json()["trace_id"]
    assert await runs(client) == 2


async def test_keys_are_per_user(client, alice, users):
    bob = await users.make("bob")
    tids = {who["user_id"]: await template(client, who) for who in (alice, bob)}
    traces = set()
    for who in (alice, bob):
        answer = await client.post(f"{WF}/run", headers={**who["headers"], "Idempotency-Key": "k"},
                                   json={"template_id": tids[who["user_id"]]})
        assert answer.status_code == 202
        traces.add(answer.json()["trace_id"])
    assert len(traces) == 2


async def test_concurrent_duplicates_start_one_run(client, alice):
    tid = await template(client, alice)
    headers = {**alice["headers"], "Idempotency-Key": "race"}
    answers = await asyncio.gather(*(
        client.post(f"{WF}/run", headers=headers, json={"template_id": tid, "input": "x"}) for _ in range(8)))
    assert sorted(a.status_code for a in answers) == [200] * 7 + [202], [a.text for a in answers]
    assert len({a.json()["trace_id"] for a in answers}) == 1
    assert await runs(client) == 1


async def test_bad_keys_and_refused_starts_are_not_remembered(client, alice):
    tid = await template(client, alice)
    too_long = await client.post(f"{WF}/run", headers={**alice["headers"], "Idempotency-Key": "k" * 256},
                                 json={"template_id": tid})
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["field"] == "Idempotency-Key"
    ok = await client.post(f"{WF}/run", headers={**alice["headers"], "Idempotency-Key": "k" * 255},
                           json={"template_id": tid})
    assert ok.status_code == 202
    headers = {**alice["headers"], "Idempotency-Key": "refused"}
    bad = await client.post(f"{WF}/run", headers=headers, json={"template_id": "nope"})
    assert bad.status_code == 404
    assert await client.app.ctx.core.db.count(RunStartKey.select()) == 1
    good = await client.post(f"{WF}/run", headers=headers, json={"template_id": tid})
    assert good.status_code == 202


async def test_a_key_older_than_24_hours_starts_a_new_run(client, alice):
    import datetime as dt

    from orchestra.db.models import utcnow

    tid = await template(client, alice)
    headers = {**alice["headers"], "Idempotency-Key": "daily"}
    first = await client.post(f"{WF}/run", headers=headers, json={"template_id": tid})
    core = client.app.ctx.core
    await core.db.aexecute(RunStartKey.update(created_at=utcnow() - dt.timedelta(hours=25)))
    again = await client.post(f"{WF}/run", headers=headers, json={"template_id": tid, "input": "other"})
    assert again.status_code == 202 and again.json()["trace_id"] != first.json()["trace_id"]
    assert await core.db.count(RunStartKey.select()) == 1
