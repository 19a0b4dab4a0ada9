"""End to end, the workflow language (SPEC §7): a real `orchestra serve` process, the fake
model on loopback, the three example templates (examples/templates), and a run retried
over HTTP. Each run's events and the fake's call count are checked exactly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login
from tests.fakes.fake_llm import FakeLLM

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "templates"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    fake = FakeLLM()
    fake.start()
    server = ServerProcess(tmp_path_factory.mktemp("lang") / "home").start()
    admin = login(server, "admin", "ADMINISTRATOR")
    http = httpx.Client(base_url=server.base_url + "/api/v1", headers=admin, timeout=20)
    provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                            "model_id": "fake-model", "api_key": "k",
                                            "base_url": fake.base_url})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "helper", "provider_id": provider.json()["provider_id"]})
    assert worker.status_code == 201, worker.text
    yield {"http": http, "fake": fake, "worker": worker.json()["worker_id"]}
    http.close()
    server.stop()
    fake.stop()


def example(world, name: str, **changes) -> str:
    body = json.loads((EXAMPLES / f"{name}.json").read_text())  # its steps name the worker helper
    for sid, fields in changes.items():
        next(s for s in body["steps"] if s["id"] == sid).update(fields)
    body["name"] += f" {time.monotonic_ns()}"  # one template per use
    created = world["http"].post("/workflow/template", json=body)
    assert created.status_code == 201, created.text
    return created.json()["template_id"]


def run(world, template_id: str, input) -> str:
    started = world["http"].post("/workflow/run", json={"template_id": template_id, "input": input})
    assert started.status_code == 202, started.text
    return started.json()["trace_id"]


def wait(world, trace_id: str, *statuses: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = world["http"].get(f"/workflow/run/{trace_id}").json()
        if body["status"] in statuses or time.monotonic() > deadline:
            assert body["status"] in statuses, body
            return body
        time.sleep(0.05)


def events(world, trace_id: str) -> list[dict]:
    return [{**e["data"], "kind": e["kind"]}
            for e in world["http"].get(f"/workflow/run/{trace_id}/events").json()["events"]]


def test_routing_by_category_runs_only_the_matching_branch(world):
    fake = world["fake"]
    fake.reset()
    tid = example(world, "routing")
    trace_id = run(world, tid, "My billing statement charges me twice")
    detail = wait(world, trace_id, "succeeded", "failed")
    assert detail["status"] == "succeeded", detail["error"]
    steps = {s["step_id"]: s for s in detail["steps"]}
    assert steps["classify"]["output"] == {"category": "billing"}
    assert (steps["billing"]["status"], steps["technical"]["status"], steps["reply"]["status"]) == (
        "succeeded", "skipped", "succeeded")
    evs = events(world, trace_id)
    assert [(e["step_id"], e["reason"]) for e in evs if e["kind"] == "step_skipped"] == [("technical", "when")]
    assert len(fake.chat_requests) == 3  # classify, billing, reply: never the skipped branch
    assert fake.chat_requests[2]["messages"][-1]["content"].endswith(steps["billing"]["output"])
    finished = evs[-1]
    assert finished["kind"] == "run_finished"
    assert finished["output"] == {"category": "billing", "reply": steps["reply"]["output"]}


def test_structured_review_with_a_human_approval_form(world):
    fake = world["fake"]
    fake.reset()
    tid = example(world, "review_approval")
    refused = world["http"].post("/workflow/run", json={"template_id": tid, "input": {"topic": 7}})
    assert refused.status_code == 422
    assert refused.json()["detail"] == [{"field": "input.topic", "problem": '7 is not of type "string"'}]
    fake.script_text("A post about tea.")
    fake.script_json({"approved": "maybe", "notes": "fine"})  # wrong: one repair round follows
    trace_id = run(world, tid, {"topic": "tea"})
    detail = wait(world, trace_id, "waiting_reply")
    asked = detail["pending_replies"][0]
    assert asked["step_id"] == "approve"
    assert asked["prompt"] == "The reviewer says: fake answer (ready: true). Publish the post?"
    evs = events(world, trace_id)
    requested = [e for e in evs if e["kind"] == "reply_requested"][0]
    assert requested["schema"]["properties"]["channel"]["enum"] == ["blog", "newsletter"]
    http = world["http"]
    wrong = http.post(f"/workflow/reply/{trace_id}", json={"content": {"approved": "yes"}})
    assert wrong.status_code == 422 and wrong.json()["detail"][0]["field"] == "content.approved"
    assert wait(world, trace_id, "waiting_reply")["pending_replies"][0]["request_id"] == asked["request_id"]
    ok = http.post(f"/workflow/reply/{trace_id}", json={"content": {"approved": True, "channel": "blog"}})
    assert ok.status_code == 200, ok.text
    detail = wait(world, trace_id, "succeeded", "failed")
    assert detail["status"] == "succeeded", detail["error"]
    steps = {s["step_id"]: s for s in detail["steps"]}
    assert steps["review"]["output"] == {"approved": True, "notes": "fake answer"}
    assert steps["approve"]["output"] == {"approved": True, "channel": "blog"}
    assert steps["publish"]["status"] == "succeeded"
    assert len(fake.chat_requests) == 4  # draft, review, its repair, publish
    assert 'output.approved: "maybe" is not of type "boolean"' in fake.chat_requests[2]["messages"][-1]["content"]
    assert events(world, trace_id)[-1]["output"]["published"] is True


def test_a_step_with_timeout_and_retry_then_a_run_retried_over_http(world):
    fake = world["fake"]
    fake.reset()
    tid = example(world, "timeout_retry", research={"timeout_seconds": 1,
                                                     "retry": {"max_attempts": 3, "backoff_seconds": 0.1}})
    fake.script_text("too slow", initial_delay=3)  # attempt 1: past timeout_seconds
    fake.script_error(400, "bad request")  # attempt 2: a provider error
    fake.script_text("three facts")  # attempt 3
    trace_id = run(world, tid, "tea")
    detail = wait(world, trace_id, "succeeded", "failed")
    assert detail["status"] == "succeeded", detail["error"]
    evs = events(world, trace_id)
    retrying = [e for e in evs if e["kind"] == "step_retrying"]
    assert [(e["attempt"], e["error"]) for e in retrying] == [
        (1, "timed out after 1 s"), (2, "Provider 'fake' (model fake-model): bad request")]
    assert all(0.075 <= e["delay_seconds"] / 2 ** (e["attempt"] - 1) <= 0.125 for e in retrying)
    starts = [e.get("attempt") for e in evs if e["kind"] == "step_started" and e["step_id"] == "research"]
    assert starts == [None, 2, 3]
    research = next(s for s in detail["steps"] if s["step_id"] == "research")
    assert (research["attempt"], research["output"]) == (3, "three facts")
    assert fake.chat_requests[-1]["messages"][-1]["content"] == "Summarise for a reader: three facts"
    assert len(fake.chat_requests) == 4

    fake.reset()  # a failed run, retried: the step that succeeded is reused, never called
    fake.script_text("facts")
    fake.script_error(400, "summary broke")
    tid = example(world, "timeout_retry", research={"retry": {"max_attempts": 1}},
                  summary={"on_error": "fail"})
    failed = run(world, tid, "coffee")
    assert wait(world, failed, "succeeded", "failed")["status"] == "failed"
    http = world["http"]
    retried = http.post(f"/workflow/run/{failed}/retry")
    assert retried.status_code == 202, retried.text
    assert retried.json()["retry_of"] == failed and retried.json()["status"] == "queued"
    again = wait(world, retried.json()["trace_id"], "succeeded", "failed")
    assert again["status"] == "succeeded" and again["retry_of"] == failed
    steps = {s["step_id"]: s for s in again["steps"]}
    assert (steps["research"]["reused"], steps["research"]["output"]) == (True, "facts")
    assert steps["summary"]["reused"] is False
    assert len(fake.chat_requests) == 3  # research once (first run), summary twice
    assert http.post(f"/workflow/run/{again['trace_id']}/retry").status_code == 409
