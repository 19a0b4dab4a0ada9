"""Outbound event deliveries with real server processes (SPEC §11): a receiving server
that fails its first three answers gets the event on the fourth, each attempt signed
and under the same webhook-id, after the real backoff (about 5 + 10 + 20 s); and a
process killed (SIGKILL) mid-delivery loses nothing: another process on the same
PostgreSQL takes the delivery over once its claim runs out and delivers it, with the
same webhook-id and body. Receivers listen on loopback only."""

from __future__ import annotations

import time

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import fake_worker, login
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.e2e


def setup(server: ServerProcess, fake: FakeLLM, receiver_url: str) -> tuple[httpx.Client, str, str]:
    headers = login(server, "admin", "ADMINISTRATOR")
    http = httpx.Client(base_url=server.base_url + "/api/v1", headers=headers, timeout=30)
    worker = fake_worker(http, fake)
    made = http.post("/workflow/template", json={"name": "t", "steps": [
        {"id": "a", "agent": {"worker": worker}, "prompt": "Say {{input}}"}]})
    assert made.status_code == 201, made.text
    sub = http.post("/workflow/subscription", json={"url": receiver_url, "events": ["run.succeeded"]})
    assert sub.status_code == 201, sub.text
    return http, made.json()["template_id"], sub.json()


def start_run(http: httpx.Client, template_id: str) -> str:
    started = http.post("/workflow/run", json={"template_id": template_id, "input": "hello"})
    assert started.status_code == 202, started.text
    return started.json()["trace_id"]


def deliveries(http: httpx.Client, subscription_id: str) -> list[dict]:
    answer = http.get(f"/workflow/subscription/{subscription_id}/deliveries")
    assert answer.status_code == 200, answer.text
    return answer.json()["deliveries"]


def test_a_receiver_failing_three_times_gets_the_event_on_the_fourth(tmp_path):
    with FakeLLM() as fake, WebhookReceiver(statuses=[500, 502, 503]) as hook:
        server = ServerProcess(tmp_path / "s").start()
        try:
            http, template_id, sub = setup(server, fake, hook.url)
            trace_id = start_run(http, template_id)
            began = time.time()
            requests = hook.wait_for(4, timeout=90)
            assert len({r.headers["webhook-id"] for r in requests}) == 1
            assert len({r.body for r in requests}) == 1
            for request in requests:  # each attempt signed with its own timestamp
                payload = Webhook(sub["secret"]).verify(request.body, request.headers)
                assert payload["trace_id"] == trace_id and payload["type"] == "run.succeeded"
            gaps = [b.at - a.at for a, b in zip(requests, requests[1:], strict=False)]
            assert 4 <= gaps[0] <= 30 and gaps[1] > gaps[0] and gaps[2] > gaps[1], gaps
            assert time.time() - began < 90
            for _ in range(50):
                (delivery,) = deliveries(http, sub["subscription_id"])
                if delivery["status"] == "delivered":
                    break
                time.sleep(0.1)
            assert delivery["status"] == "delivered"
            assert [a["response_code"] for a in delivery["attempts"]] == [500, 502, 503, 200]
            assert delivery["webhook_id"] == requests[0].headers["webhook-id"]
            log = server.log_path.read_text(errors="replace")
            assert sub["secret"] not in log and sub["secret"].removeprefix("whsec_") not in log
        finally:
            server.stop()


def test_a_process_killed_mid_delivery_loses_nothing(tmp_path, postgres_url):
    with FakeLLM() as fake, WebhookReceiver(delay=20.0) as hook:
        first = ServerProcess(tmp_path / "a", database_url=postgres_url).start()
        second = ServerProcess(tmp_path / "b", database_url=postgres_url)
        try:
            http, template_id, sub = setup(first, fake, hook.url)
            trace_id = start_run(http, template_id)
            (request,) = hook.wait_for(1, timeout=30)  # the owner's attempt is in flight …
            first.kill()  # … and its process dies before the answer (20 s later)
            hook.delay = 0.0
            second.start()
            later = hook.wait_for(2, timeout=60)  # the other process, once the claim ran out
            assert later[1].headers["webhook-id"] == request.headers["webhook-id"]
            assert later[1].body == request.body
            payload = Webhook(sub["secret"]).verify(later[1].body, later[1].headers)
            assert payload["trace_id"] == trace_id
            other = httpx.Client(base_url=second.base_url + "/api/v1", headers=http.headers, timeout=30)
            for _ in range(50):
                (delivery,) = deliveries(other, sub["subscription_id"])
                if delivery["status"] == "delivered":
                    break
                time.sleep(0.1)
            assert delivery["status"] == "delivered" and delivery["attempts"][-1]["response_code"] == 200
        finally:
            first.stop()
            second.stop()
