"""kill -9 the server while a run waits for a reply; restart on the same home.

The run is `interrupted`, its stored events are intact, and its stream ends with the
terminal event appended at restart (nobody waits forever).
"""

from __future__ import annotations

import httpx

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login, sse_frames


def test_kill_9_mid_run_then_restart_marks_the_run_interrupted(tmp_path):
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
        assert http.get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_reply"
    finally:
        server.kill()

    restarted = ServerProcess(home).start()
    try:
        http = httpx.Client(base_url=restarted.base_url + "/api/v1", timeout=15)
        token = httpx.post(f"{restarted.base_url}/api/v1/auth/login",
                           json={"user_name": "crash", "password": "password-123"}).json()["access_token"]
        http.headers["Authorization"] = f"Bearer {token}"
        run = http.get(f"/workflow/run/{trace_id}").json()
        assert run["status"] == "interrupted" and run["finished_at"]
        assert run["steps"][0]["status"] == "interrupted"
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            after = list(sse_frames(response))
        assert after[: len(before)] == before  # stored events intact
        assert [f[0] for f in after] == list(range(1, len(before) + 2))
        seq, kind, data = after[-1]
        assert kind == "run_failed" and data["status"] == "interrupted" and data["reason"]
        assert http.get(f"/workflow/sse/{trace_id}", headers={"Last-Event-ID": str(seq)}).status_code == 204
        reply = http.post(f"/workflow/reply/{trace_id}", json={"content": "late"})
        assert reply.status_code == 409 and reply.json()["error"] == "ConflictError"
    finally:
        restarted.stop()
