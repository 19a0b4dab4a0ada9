"""Between users on a real `orchestra serve` process (SPEC §15b): one user's `/mcp`
sessions are capped while another's stay open, and `/mcp` bodies are strict JSON; a
flood of unsigned calls cannot use up an inbound hook's limit; an HTTP step's
`timeout_seconds` bounds the whole exchange against a server that drips its answer."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import httpx
from standardwebhooks import Webhook

from orchestra.testing.fake_http import FakeHttp
from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login

LEGACY = "2025-06-18"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
START_SECONDS = 120  # a loaded CI machine may take long to import and start a server
HUMAN = [{"id": "ask", "agent": {"human": True}, "prompt": "About {{input}}?"}]


def open_session(http: httpx.Client, headers: dict) -> str:
    opened = http.post("/mcp", headers={**headers, **ACCEPT}, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}})
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["mcp-session-id"]
    done = http.post("/mcp", headers={**headers, **ACCEPT, "mcp-session-id": session_id,
                                      "mcp-protocol-version": LEGACY},
                     json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202, done.text
    return session_id


def is_open(http: httpx.Client, headers: dict, session_id: str) -> bool:
    answer = http.post("/mcp", headers={**headers, **ACCEPT, "mcp-session-id": session_id,
                                        "mcp-protocol-version": LEGACY},
                       json={"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert answer.status_code in (200, 404), answer.text
    return answer.status_code == 200


def test_one_user_cannot_fill_the_mcp_sessions_and_bodies_are_strict(tmp_path):
    server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_MAX_MCP_SESSIONS_PER_USER": "5"}).start(
        timeout=START_SECONDS)
    try:
        alice, bob = login(server, "alice"), login(server, "bob")
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            bobs = open_session(http, bob)
            alices = [open_session(http, alice) for _ in range(12)]
            assert [is_open(http, alice, s) for s in alices] == [False] * 7 + [True] * 5
            assert is_open(http, bob, bobs)
            for body in (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": NaN}}',
                         b'{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "ping"}'):
                refused = http.post("/mcp", headers={**alice, **ACCEPT}, content=body)
                assert refused.status_code == 400, refused.text
                assert refused.json()["error"]["code"] == -32700
    finally:
        server.stop()


def signed(secret: str, body: bytes) -> dict:
    msg_id = f"msg_{uuid.uuid4().hex}"
    when = dt.datetime.now(dt.UTC)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": Webhook(secret).sign(msg_id, when, body.decode()),
            "content-type": "application/json"}


def test_a_flood_of_unsigned_calls_leaves_the_hooks_limit_to_its_sender(tmp_path):
    server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_RATE_LIMIT_HOOK": "5/minute",
                                                   "ORCHESTRA_RATE_LIMIT_HOOK_UNVERIFIED": "20/minute"}).start(
        timeout=START_SECONDS)
    try:
        alice = login(server, "alice")
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            made = http.post("/api/v1/workflow/template", headers=alice, json={"name": "t", "steps": HUMAN})
            hook = http.post("/api/v1/workflow/hook", headers=alice,
                             json={"template_id": made.json()["template_id"]}).json()
            url = f"/api/v1/hooks/{hook['hook_id']}"
            body = b'{"n": 1}'
            flood = [http.post(url, content=body, headers={"content-type": "application/json"}).status_code
                     for _ in range(40)]
            assert flood == [401] * 20 + [429] * 20
            sent = [http.post(url, content=body, headers=signed(hook["secret"], body)).status_code
                    for _ in range(6)]
            assert sent == [202] * 5 + [429]
            runs = http.get("/api/v1/workflow/run", headers=alice).json()["runs"]
            assert len(runs) == 5
            for run in runs:
                http.post(f"/api/v1/workflow/cancel/{run['trace_id']}", headers=alice)
    finally:
        server.stop()


def test_an_http_steps_timeout_bounds_the_whole_exchange(tmp_path):
    with FakeHttp() as target:
        server = ServerProcess(tmp_path / "home").start(timeout=START_SECONDS)
        try:
            alice = login(server, "alice")
            with httpx.Client(base_url=f"{server.base_url}/api/v1/workflow", timeout=30, headers=alice) as http:
                steps = [{"id": "drip", "http": {"method": "GET", "url": f"{target.url}/drip/40?every=0.25",
                                                  "timeout_seconds": 1}}]
                made = http.post("/template", json={"name": "drip", "steps": steps})
                assert made.status_code == 201, made.text
                began = time.monotonic()
                trace_id = http.post("/run", json={"template_id": made.json()["template_id"]}).json()["trace_id"]
                for _ in range(300):
                    run = http.get(f"/run/{trace_id}").json()
                    if run["status"] in ("failed", "succeeded"):
                        break
                    time.sleep(0.05)
                took = time.monotonic() - began
                assert run["status"] == "failed", run
                assert "no whole answer within 1 s (timeout_seconds)" in run["error"], run["error"]
                assert took < 6, f"the step ran {took:.1f} s against a dripping server"
        finally:
            server.stop()
