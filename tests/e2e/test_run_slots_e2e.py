"""No user starves another of run slots (SPEC §15b), on a real `orchestra serve` with
`ORCHESTRA_MAX_RUNS=2`: one user's five runs waiting on a human step hold no slot, so
another user's run (an agent step on the fake model) starts and finishes meanwhile; the
waiting runs then take their replies and finish too. With `ORCHESTRA_MAX_RUNS_PER_USER=1`
a user's second busy run stays `queued` (202, never refused) while another user's runs."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_scale_out import wait_for
from tests.e2e.test_workflow_e2e import login
from tests.fakes.fake_llm import FakeLLM

pytestmark = pytest.mark.e2e


@pytest.fixture
def slots_server(tmp_path):
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_MAX_RUNS": "2"}).start(timeout=90)
        try:
            yield server, fake
        finally:
            server.stop()


def client(server: ServerProcess, name: str, role: str = "USER") -> httpx.Client:
    return httpx.Client(base_url=server.base_url + "/api/v1", headers=login(server, name, role), timeout=20)


def template(http: httpx.Client, name: str, steps: list) -> str:
    made = http.post("/workflow/template", json={"name": name, "steps": steps})
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


def status(http: httpx.Client, trace_id: str) -> str:
    return http.get(f"/workflow/run/{trace_id}").json()["status"]


def test_runs_waiting_for_a_human_hold_no_slot(slots_server):
    server, fake = slots_server
    admin = client(server, "admin", "ADMINISTRATOR")
    provider = admin.post("/provider", json={  # providers are shared: bob's worker uses it
        "name": "fake", "provider": "openai_compatible", "model_id": "fake-model",
        "api_key": "k", "base_url": fake.base_url})
    assert provider.status_code == 201, provider.text
    alice, bob = client(server, "alice"), client(server, "bob")
    worker = bob.post("/agent/worker", json={"name": "w", "provider_id": provider.json()["provider_id"],
                                             "tools": []})
    assert worker.status_code == 201, worker.text
    asks = template(alice, "asks", [{"id": "q", "agent": {"human": True}, "prompt": "Go on?"}])
    waiting = []
    for _ in range(5):
        started = alice.post("/workflow/run", json={"template_id": asks, "input": "x"})
        assert started.status_code == 202, started.text
        waiting.append(started.json()["trace_id"])
    for trace_id in waiting:  # all five wait at once with two slots: none holds one
        wait_for(lambda t=trace_id: status(alice, t) == "waiting_reply", 60)

    answers = template(bob, "answers", [{"id": "a", "agent": {"worker": worker.json()["worker_id"]},
                                         "prompt": "Say hi"}])
    started = bob.post("/workflow/run", json={"template_id": answers, "input": "hello"})
    assert started.status_code == 202, started.text
    theirs = started.json()["trace_id"]
    assert wait_for(lambda: status(bob, theirs) in ("succeeded", "failed"), 60)
    assert status(bob, theirs) == "succeeded", bob.get(f"/workflow/run/{theirs}").json()
    assert [status(alice, t) for t in waiting] == ["waiting_reply"] * 5

    for trace_id in waiting:
        replied = alice.post(f"/workflow/reply/{trace_id}", json={"content": "yes"})
        assert replied.status_code in (200, 202), replied.text
    for trace_id in waiting:
        wait_for(lambda t=trace_id: status(alice, t) == "succeeded", 60)
