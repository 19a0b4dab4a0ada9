"""MCP header and env values and provider API keys never reach a log line, an event or an
error (SPEC §15b; issue 40 point 6: "MCP header values and provider keys reach the log
in an SDK traceback"), against a real `orchestra serve` whose MCP server and model
provider are a loopback HTTP server answering 500 to everything (every SDK fails). The
mechanism (every such value joins the redaction set when stored or read for use) is
tested in-process by tests/observability/test_credential_redaction.py."""

from __future__ import annotations

import time

import httpx
import pytest

from orchestra.testing.fake_http import FakeHttp
from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login

pytestmark = pytest.mark.e2e

MCP_HEADER = "mcp-header-value-7f6e5d4c3b2a"
PROVIDER_KEY = "sk-provider-key-0f1e2d3c4b5a6978"


def test_failing_mcp_servers_and_providers_log_no_credential(tmp_path):
    with FakeHttp() as broken:
        server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_EGRESS_ALLOW": "127.0.0.1"}).start()
        try:
            admin = httpx.Client(base_url=server.base_url + "/api/v1", timeout=30,
                                 headers=login(server, "root", "ADMINISTRATOR"))
            made = admin.post("/resource/mcp", json={
                "name": "broken", "transport": "streamable_http", "url": broken.url + "/status/500",
                "headers": {"Authorization": f"Bearer {MCP_HEADER}"}})
            assert made.status_code == 201, made.text
            refreshed = admin.post(f"/resource/mcp/{made.json()['server_id']}/refresh")
            provider = admin.post("/provider", json={
                "name": "broken", "provider": "openai_compatible", "model_id": "m",
                "api_key": PROVIDER_KEY, "base_url": broken.url + "/status/500"})
            assert provider.status_code == 201, provider.text
            provider_id = provider.json()["provider_id"]
            checked = admin.post(f"/provider/{provider_id}/check")
            worker = admin.post("/agent/worker", json={"name": "w", "provider_id": provider_id, "tools": []})
            assert worker.status_code == 201, worker.text
            template = admin.post("/workflow/template", json={"name": "t", "steps": [
                {"id": "a", "agent": {"worker": worker.json()["worker_id"]}, "prompt": "hi",
                 "retry": {"max_attempts": 1}}]})
            assert template.status_code == 201, template.text
            started = admin.post("/workflow/run", json={"template_id": template.json()["template_id"], "input": "x"})
            trace_id = started.json()["trace_id"]
            deadline = time.monotonic() + 60
            while admin.get(f"/workflow/run/{trace_id}").json()["status"] not in ("failed", "succeeded"):
                assert time.monotonic() < deadline
                time.sleep(0.2)
            answers = [made.text, refreshed.text, provider.text, checked.text,
                       admin.get(f"/workflow/run/{trace_id}").text, admin.get(f"/workflow/run/{trace_id}/events").text,
                       admin.get("/resource/mcp").text]
        finally:
            server.stop()
        sent = [r["headers"] for r in broken.requests]
        # the credentials were used (so the failures are theirs), and appear nowhere
        assert any(h.get("authorization") == f"Bearer {MCP_HEADER}" for h in sent)
        assert any(h.get("authorization") == f"Bearer {PROVIDER_KEY}" for h in sent)
    log = server.log_path.read_text()
    for where, text in [("log", log), *(("answer", a) for a in answers)]:
        assert MCP_HEADER not in text, where
        assert PROVIDER_KEY not in text, where
