"""A restarted server with a poisoned run waiting answers at once (issue 23, finding 3).

A run waits on a human step whose prompt holds a heavy comprehension, rendered once by a
server that allowed it a long deadline. The server is killed (-9) and restarted with the
default deadline: resuming the run renders that prompt again. Before, the restarted
server evaluated it on its event loop and answered nothing for minutes; now the
evaluation runs in a worker process past whose deadline the step fails, naming the
limit, while every request is answered at once.
"""

from __future__ import annotations

import time

import httpx

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login

HEAVY = "input.map(x, x).size()"  # quadratic in the CEL library: ~10 s over 20k items
ITEMS = list(range(20_000))


def test_a_restart_with_a_poisoned_run_waiting_answers_within_5_s_and_fails_the_step(tmp_path):
    home = tmp_path / "home"
    patient = ServerProcess(home, env={"ORCHESTRA_EXPRESSION_TIMEOUT_MS": "180000"}).start()
    try:
        user = login(patient, "poison")
        http = httpx.Client(base_url=patient.base_url + "/api/v1", headers=user, timeout=30)
        steps = [{"id": "count", "agent": {"human": True}, "prompt": "How many? {{ " + HEAVY + " }}"}]
        created = http.post("/workflow/template", json={"name": "poison", "steps": steps,
                                                         "input_schema": {"type": "array"}})
        assert created.status_code == 201, created.text
        started = http.post("/workflow/run", json={"template_id": created.json()["template_id"],
                                                    "input": ITEMS})
        assert started.status_code == 202, started.text
        trace_id = started.json()["trace_id"]
        deadline = time.monotonic() + 170
        while (run := http.get(f"/workflow/run/{trace_id}").json())["status"] != "waiting_reply":
            assert run["status"] in ("queued", "running") and time.monotonic() < deadline, run
            time.sleep(0.2)
        assert run["pending_replies"][0]["prompt"] == f"How many? {len(ITEMS)}"
        http.close()
    finally:
        patient.kill()

    restarted = ServerProcess(home)  # the default deadline, ORCHESTRA_EXPRESSION_TIMEOUT_MS=1000
    began = time.monotonic()
    restarted.start()
    try:
        token = httpx.post(f"{restarted.base_url}/api/v1/auth/login",
                           json={"user_name": "poison", "password": "password-123"}, timeout=5)
        assert token.status_code == 200, token.text
        http = httpx.Client(base_url=restarted.base_url + "/api/v1", timeout=5,
                            headers={"Authorization": f"Bearer {token.json()['access_token']}"})
        slowest = 0.0
        while True:  # every answer within 5 s (httpx's timeout), while the run resumes and fails
            asked = time.monotonic()
            run = http.get(f"/workflow/run/{trace_id}").json()
            slowest = max(slowest, time.monotonic() - asked)
            if run["status"] == "failed":
                break
            assert time.monotonic() - began < 60, run
            time.sleep(0.1)
        assert slowest < 5, slowest
        assert "Step 'count' failed" in run["error"]
        assert "ORCHESTRA_EXPRESSION_TIMEOUT_MS" in run["error"] and HEAVY in run["error"]
        step = next(s for s in run["steps"] if s["step_id"] == "count")
        assert step["status"] == "failed" and "took longer than 1000 ms" in step["error"]
        http.close()
    finally:
        restarted.stop()
