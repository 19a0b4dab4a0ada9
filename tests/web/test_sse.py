"""`GET /api/v1/workflow/sse/{trace_id}` in process: replay, resume, 204, auth, headers.

Live streaming against a real server is in tests/e2e/test_workflow_e2e.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

API = "/api/v1/workflow"


def parse(raw: str) -> list[tuple[int, str, dict]]:
    """(id, event, data) of each SSE frame; comments skipped."""
    out = []
    for block in raw.split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            out.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return out


@pytest.fixture
async def finished(client, users):
    """A run of one human step, answered, and finished; returns (user, trace_id)."""
    alice = await users.make("alice")
    h = alice["headers"]
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "Name?"}]
    tid = (await client.post(f"{API}/template", headers=h, json={"name": "t", "steps": steps})).json()["template_id"]
    trace_id = (await client.post(f"{API}/run", headers=h, json={"template_id": tid})).json()["trace_id"]
    for _ in range(200):
        if (await client.get(f"{API}/run/{trace_id}", headers=h)).json()["status"] == "waiting_reply":
            break
        await asyncio.sleep(0.02)
    assert (await client.post(f"{API}/reply/{trace_id}", headers=h, json={"content": "Ann"})).status_code == 200
    for _ in range(200):
        if (await client.get(f"{API}/run/{trace_id}", headers=h)).json()["status"] == "succeeded":
            break
        await asyncio.sleep(0.02)
    return alice, trace_id


async def test_replay_of_a_finished_run(client, finished):
    alice, trace_id = finished
    response = await client.get(f"{API}/sse/{trace_id}", headers=alice["headers"])
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    frames = parse(response.text)
    assert [f[0] for f in frames] == list(range(1, len(frames) + 1))
    assert [f[1] for f in frames] == [
        "run_started", "step_started", "reply_requested", "reply_received", "step_finished", "run_finished"
    ]
    for seq, _kind, data in frames:
        assert data["seq"] == seq and data["trace_id"] == trace_id and data["ts"].endswith("Z")
    assert frames[2][2]["prompt"] == "Name?" and frames[2][2]["request_id"] == frames[3][2]["request_id"]
    assert frames[2][2]["step_id"] == "h" and frames[3][2]["content"] == "Ann"


async def test_resume_after_last_event_id_header_or_query(client, finished):
    alice, trace_id = finished
    by_header = await client.get(f"{API}/sse/{trace_id}", headers={**alice["headers"], "Last-Event-ID": "3"})
    assert [f[0] for f in parse(by_header.text)] == [4, 5, 6]
    by_query = await client.get(f"{API}/sse/{trace_id}?last_event_id=5&access_token={alice['access_token']}")
    assert [f[1] for f in parse(by_query.text)] == ["run_finished"]


async def test_reconnect_after_the_terminal_event_gets_204(client, finished):
    alice, trace_id = finished
    response = await client.get(f"{API}/sse/{trace_id}", headers={**alice["headers"], "Last-Event-ID": "6"})
    assert response.status_code == 204 and response.content == b""


async def test_stream_errors_are_json(client, finished, users):
    alice, trace_id = finished
    bob = await users.make("bob")
    for response, status, error in (
        (await client.get(f"{API}/sse/{trace_id}"), 401, "AuthenticationRequiredError"),
        (await client.get(f"{API}/sse/{trace_id}?access_token=garbage"), 401, "TokenInvalidError"),
        (await client.get(f"{API}/sse/{trace_id}", headers=bob["headers"]), 404, "NotFoundError"),
        (await client.get(f"{API}/sse/nope", headers=alice["headers"]), 404, "NotFoundError"),
        (await client.get(f"{API}/sse/{trace_id}", headers={**alice["headers"], "Last-Event-ID": "x"}),
         422, "ValidationError"),
        (await client.post(f"{API}/sse/{trace_id}", headers=alice["headers"]), 405, "MethodNotAllowedError"),
    ):
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["error"] == error


async def test_an_orphaned_run_stream_shows_its_end(client, users):
    """A run whose process died and was claimed too often: the stream ends with the
    terminal event the claiming engine stores."""
    from orchestra.db.models import WorkflowRun
    from orchestra.engine.store.events import EventLog

    alice = await users.make("alice")
    core = client.app.ctx.core
    run = await WorkflowRun.acreate(owner=alice["user_id"], template_name="t", steps=[],
                                    status="running", attempts=3,
                                    owner_process="gone:1:dead#1", lease_until=1.0)
    await EventLog(core.db).append(run.trace_id, "run_started")
    core.engine.wake()  # as a `wake` signal would
    response = await client.get(f"{API}/sse/{run.trace_id}", headers=alice["headers"])
    frames = parse(response.text)
    assert [f[1] for f in frames] == ["run_started", "run_failed"]
    assert frames[-1][2]["status"] == "interrupted"

async def test_an_empty_last_event_id_query_is_422_and_an_empty_header_is_absent(client, finished):
    alice, trace_id = finished
    empty = await client.get(f"{API}/sse/{trace_id}?last_event_id=", headers=alice["headers"])
    assert empty.status_code == 422, empty.text
    assert empty.json()["detail"][0]["field"] == "last_event_id"
    header = await client.get(f"{API}/sse/{trace_id}", headers={**alice["headers"], "Last-Event-ID": ""})
    assert header.status_code == 200 and parse(header.text)[0][0] == 1


@pytest.mark.parametrize("settings_overrides", [{"sse_max_seconds": 0.5}])
async def test_a_stream_ends_at_its_deadline_with_a_retry_line(client, users, settings_overrides):
    """A run waiting for a reply: the stream stops at ORCHESTRA_SSE_MAX_SECONDS, says
    `retry:` and keeps the events it sent; the run goes on waiting."""
    alice = await users.make("alice")
    h = alice["headers"]
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "Name?"}]
    tid = (await client.post(f"{API}/template", headers=h, json={"name": "t", "steps": steps})).json()["template_id"]
    trace_id = (await client.post(f"{API}/run", headers=h, json={"template_id": tid})).json()["trace_id"]
    response = await asyncio.wait_for(client.get(f"{API}/sse/{trace_id}", headers=h), 30)
    assert response.status_code == 200
    assert response.text.endswith("retry: 100\n\n")
    kinds = [kind for _, kind, _ in parse(response.text.removesuffix("retry: 100\n\n"))]
    assert kinds[0] == "run_started" and "run_finished" not in kinds
    assert (await client.get(f"{API}/run/{trace_id}", headers=h)).json()["status"] in ("running", "waiting_reply")
