"""kill -9 the server while a run waits for a reply; restart on the same home.

The restarted server (the only one on this SQLite store) claims the run at once and
resumes it: the stored events are intact, `run_resumed` follows them, the open question
stays open under the same request id, and the answer finishes the run.
"""

from __future__ import annotations

import time
from datetime import datetime

import httpx

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login, sse_frames


def test_kill_9_mid_run_then_restart_resumes_the_run(tmp_path):
    home = tmp_path / "home"
    server = ServerProcess(home).start()
    try:
        user = login(server, "crash")
        http = httpx.Client(base_url=server.base_url + "/api/v1", headers=user, timeout=15)
        steps = [{"id": "h", "agent": {"human": True}, "prompt": "Still there?"}]
        tid = http.post("/workflow/template", json={"name": "h", "steps": steps}).json()["template_id"]
        trace_id = http.post("/workflow/run", json={"template_id": tid}).json()["trace_id"]
        before = []
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            for frame in sse_frames(response):
                before.append(frame)
                if frame[1] == "reply_requested":
                    break
        request_id = before[-1][2]["request_id"]
        assert http.get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_reply"
    finally:
        server.kill()

    restarted = ServerProcess(home).start()
    try:
        http = httpx.Client(base_url=restarted.base_url + "/api/v1", timeout=15)
        token = httpx.post(f"{restarted.base_url}/api/v1/auth/login",
                           json={"user_name": "crash", "password": "password-123"}).json()["access_token"]
        http.headers["Authorization"] = f"Bearer {token}"
        resumed = []
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            for frame in sse_frames(response):
                resumed.append(frame)
                if frame[1] == "run_resumed":
                    break
        assert resumed[: len(before)] == before  # stored events intact
        assert [f[0] for f in resumed] == list(range(1, len(before) + 2))
        assert resumed[-1][2]["attempt"] == 2 and resumed[-1][2]["restarted_steps"] == []
        run = http.get(f"/workflow/run/{trace_id}").json()
        assert run["pending_replies"] == [
            {"request_id": request_id, "step_id": "h", "prompt": "Still there?"}]
        reply = http.post(f"/workflow/reply/{trace_id}",
                          json={"content": "yes", "request_id": request_id})
        assert reply.status_code == 200, reply.text
        with http.stream("GET", f"/workflow/sse/{trace_id}",
                         headers={"Last-Event-ID": str(resumed[-1][0])}) as response:
            after = list(sse_frames(response))
        assert [f[1] for f in after] == ["reply_received", "step_finished", "run_finished"]
        assert [f[0] for f in after] == list(range(resumed[-1][0] + 1, resumed[-1][0] + 4))
        assert after[-1][2]["output"] == "yes"
        assert http.get(f"/workflow/run/{trace_id}").json()["status"] == "succeeded"
        late = http.post(f"/workflow/reply/{trace_id}", json={"content": "late"})
        assert late.status_code == 409 and late.json()["error"] == "ConflictError"
    finally:
        restarted.stop()


def test_a_human_steps_timeout_counts_from_when_it_asked_not_from_a_restart(tmp_path):
    """`timeout_seconds` of a human step is the time its question may stay open: a restart
    (or a take-over) does not start it again. The question is asked, the owner is killed,
    and the restart comes after the timeout has passed: the default is taken at once,
    not `timeout_seconds` later."""
    timeout = 6
    home = tmp_path / "home"
    server = ServerProcess(home).start()
    try:
        user = login(server, "patient")
        http = httpx.Client(base_url=server.base_url + "/api/v1", headers=user, timeout=15)
        steps = [{"id": "h", "agent": {"human": True}, "prompt": "Approve?",
                  "timeout_seconds": timeout, "default": "no answer"}]
        tid = http.post("/workflow/template", json={"name": "h", "steps": steps}).json()["template_id"]
        trace_id = http.post("/workflow/run", json={"template_id": tid}).json()["trace_id"]
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            asked = next(f for f in sse_frames(response) if f[1] == "reply_requested")
    finally:
        server.kill()
    asked_at = datetime.fromisoformat(asked[2]["ts"].replace("Z", "+00:00")).timestamp()
    while time.time() < asked_at + timeout + 0.5:  # the scenario: the restart comes late
        time.sleep(0.1)

    restarted = ServerProcess(home).start()
    try:
        token = httpx.post(f"{restarted.base_url}/api/v1/auth/login",
                           json={"user_name": "patient", "password": "password-123"}).json()["access_token"]
        http = httpx.Client(base_url=restarted.base_url + "/api/v1", timeout=30,
                            headers={"Authorization": f"Bearer {token}"})
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            frames = list(sse_frames(response))
        kinds = [f[1] for f in frames]
        assert kinds[-4:] == ["run_resumed", "reply_timed_out", "step_finished", "run_finished"], kinds
        assert frames[-1][2]["output"] == "no answer"
        resumed, timed_out = (datetime.fromisoformat(f[2]["ts"].replace("Z", "+00:00")).timestamp()
                              for f in (frames[-4], frames[-3]))
        # At once after the resume; restarting the timer would have taken `timeout` more.
        assert timed_out - resumed < timeout / 2, (resumed, timed_out)
    finally:
        restarted.stop()
