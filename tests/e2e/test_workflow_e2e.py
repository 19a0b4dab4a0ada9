"""End to end: a real `orchestra serve` process, FakeLLM on loopback, SSE read over HTTP.

A three-step template (a calculator tool call, a human reply, a streamed summary) runs
to `succeeded`; the stream, dropped mid-run and resumed with Last-Event-ID, has every
event once and in order; the replay of the finished run equals what was seen live.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.fakes.fake_llm import FakeLLM

API = "/api/v1/workflow"


def sse_frames(response: httpx.Response) -> Iterator[tuple[int, str, dict]]:
    """(id, event, data) for each event of a streamed SSE response, as they arrive."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "id" in fields:
                yield int(fields["id"]), fields["event"], json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def login(server: ServerProcess, name: str, role: str = "USER") -> dict:
    made = server.cli("user", "create", name, "--role", role, "--password-stdin", input="password-123\n")
    assert made.returncode == 0, made.stderr
    response = httpx.post(f"{server.base_url}/api/v1/auth/login",
                          json={"user_name": name, "password": "password-123"})
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def fake_worker(http: httpx.Client, fake: FakeLLM) -> str:
    """A provider on the fake model and a worker without tools on it: the worker's id."""
    provider = http.post("/provider", json={
        "name": "fake", "provider": "openai_compatible", "model_id": "fake-model",
        "api_key": "k", "base_url": fake.base_url})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={
        "name": "w", "provider_id": provider.json()["provider_id"], "tools": []})
    assert worker.status_code == 201, worker.text
    return worker.json()["worker_id"]


@pytest.fixture
def live(tmp_path):
    fake = FakeLLM()
    fake.start()
    server = ServerProcess(tmp_path / "home").start()
    yield server, fake
    server.stop()
    fake.stop()


def test_three_step_run_streams_resumes_and_replays(live):
    server, fake = live
    base = server.base_url + "/api/v1"
    admin = login(server, "admin", "ADMINISTRATOR")
    http = httpx.Client(base_url=base, headers=admin, timeout=15)
    provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                            "model_id": "fake-model", "api_key": "k",
                                            "base_url": fake.base_url})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "calc", "provider_id": provider.json()["provider_id"],
                                              "tools": ["calculator"]})
    assert worker.status_code == 201, worker.text
    wid = worker.json()["worker_id"]
    steps = [
        {"id": "calc", "agent": {"worker": wid}, "prompt": "Compute {{input}}", "depends_on": []},
        {"id": "ask", "agent": {"human": True}, "prompt": "Is {{steps.calc.output}} right?",
         "depends_on": ["calc"]},
        {"id": "final", "agent": {"worker": wid}, "depends_on": ["ask"],
         "prompt": "Summarise {{steps.calc.output}} given {{steps.ask.output}}"},
    ]
    template = http.post("/workflow/template", json={"name": "three", "steps": steps})
    assert template.status_code == 201, template.text
    fake.script_tool_call("calculator", {"expression": "6*7"})
    fake.script_text("The answer is 42.")
    fake.script_text("Confirmed: six times seven is forty-two, as the user agreed.", chunks=12, delay=0.03)

    started = http.post("/workflow/run", json={"template_id": template.json()["template_id"], "input": "6*7"})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]

    seen: list[tuple[int, str, dict]] = []
    with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        for frame in sse_frames(response):
            seen.append(frame)
            if frame[1] == "reply_requested":
                break  # drop the stream mid-run
    request = seen[-1][2]
    assert request["prompt"] == "Is The answer is 42. right?" and request["step_id"] == "ask"
    assert http.get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_reply"
    replied = http.post(f"/workflow/reply/{trace_id}", json={"content": "yes", "request_id": request["request_id"]})
    assert replied.status_code == 200, replied.text
    time.sleep(0.3)  # events keep coming while nobody listens

    headers = {"Last-Event-ID": str(seen[-1][0])}
    token = admin["Authorization"].split()[1]
    with httpx.stream("GET", f"{base}/workflow/sse/{trace_id}?access_token={token}", headers=headers,
                      timeout=15) as response:
        assert response.status_code == 200
        seen.extend(sse_frames(response))

    assert [f[0] for f in seen] == list(range(1, len(seen) + 1))  # once each, in order
    kinds = [f[1] for f in seen]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.count("run_finished") == 1 and kinds.count("step_finished") == 3
    call = next(f[2] for f in seen if f[1] == "tool_call")
    result = next(f[2] for f in seen if f[1] == "tool_result")
    assert call["name"] == "calculator" and result["result"] == "42" and result["call_id"] == call["call_id"]
    tokens = "".join(f[2]["text"] for f in seen if f[1] == "token" and f[2]["step_id"] == "final")
    assert tokens == "Confirmed: six times seven is forty-two, as the user agreed."
    assert next(f[2] for f in seen if f[1] == "reply_received")["content"] == "yes"

    run = http.get(f"/workflow/run/{trace_id}").json()
    assert run["status"] == "succeeded"
    assert [s["output"] for s in run["steps"]] == [
        "The answer is 42.", "yes", "Confirmed: six times seven is forty-two, as the user agreed."
    ]
    with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
        replay = list(sse_frames(response))
    assert replay == seen  # the replay of a finished run equals the live stream
    done = http.get(f"/workflow/sse/{trace_id}", headers={"Last-Event-ID": str(len(seen))})
    assert done.status_code == 204
    fed_back = fake.chat_requests[1]["messages"][-1]
    assert fed_back["role"] == "tool" and fed_back["content"] == "42"


def test_a_disconnecting_client_never_stops_the_run(live):
    server, fake = live
    user = login(server, "solo")
    http = httpx.Client(base_url=server.base_url + "/api/v1", headers=user, timeout=15)
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "?"}]
    tid = http.post("/workflow/template", json={"name": "h", "steps": steps}).json()["template_id"]
    trace_id = http.post("/workflow/run", json={"template_id": tid}).json()["trace_id"]
    for _ in range(5):  # open and abandon several streams
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            next(sse_frames(response))
    assert http.post(f"/workflow/reply/{trace_id}", json={"content": "ok"}).status_code == 200
    for _ in range(100):
        if http.get(f"/workflow/run/{trace_id}").json()["status"] == "succeeded":
            break
        time.sleep(0.05)
    assert http.get(f"/workflow/run/{trace_id}").json()["status"] == "succeeded"
