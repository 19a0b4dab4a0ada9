"""Traces over OTLP/HTTP to a receiver on loopback: a run started with a W3C
`traceparent` keeps that trace across a take-over — the first server stops (SIGTERM, the
run handed back mid-question), a second process on the same store resumes it, and the
spans of both processes land in the client's trace under the `POST /workflow/run` span."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login, sse_frames
from tests.observability.otlp_receiver import OTLPReceiver

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str | None:
    """SQLite: the second process restarts on the first one's home; PostgreSQL: it is
    another server with its own home, on the same database."""
    return None if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def traced_server(home, receiver: OTLPReceiver, store_url: str | None) -> ServerProcess:
    return ServerProcess(home, database_url=store_url, env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "orchestra-e2e",
    })


def test_a_run_keeps_its_trace_across_a_take_over(tmp_path, store_url):
    home = tmp_path / "home"
    second_home = home if store_url is None else tmp_path / "second-home"
    with OTLPReceiver() as receiver:
        first = traced_server(home, receiver, store_url).start()
        try:
            user = login(first, "tracer")
            http = httpx.Client(base_url=first.base_url + "/api/v1", headers=user, timeout=15)
            steps = [{"id": "h", "agent": {"human": True}, "prompt": "Still there?"}]
            tid = http.post("/workflow/template", json={"name": "h", "steps": steps}).json()["template_id"]
            started = http.post("/workflow/run", json={"template_id": tid},
                                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
            assert started.status_code == 202
            trace_id = started.json()["trace_id"]
            with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
                for frame in sse_frames(response):
                    if frame[1] == "reply_requested":
                        break
        finally:
            first.stop()  # SIGTERM: the run is handed back, its spans flushed

        second = traced_server(second_home, receiver, store_url).start()
        try:
            token = httpx.post(f"{second.base_url}/api/v1/auth/login",
                               json={"user_name": "tracer", "password": "password-123"}).json()
            http = httpx.Client(base_url=second.base_url + "/api/v1", timeout=15,
                                headers={"Authorization": f"Bearer {token['access_token']}"})
            with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
                for frame in sse_frames(response):
                    if frame[1] == "run_resumed":
                        break
            assert http.post(f"/workflow/reply/{trace_id}", json={"content": "yes"}).status_code == 200
            with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
                assert [f[1] for f in sse_frames(response)][-1] == "run_finished"
        finally:
            second.stop()
        spans = receiver.received()

    start = [s for s in spans if s.name == "POST /api/v1/workflow/run"]
    assert len(start) == 1
    assert start[0].trace_id == CLIENT_TRACE and start[0].parent_id == CLIENT_SPAN
    assert start[0].attributes["http.response.status_code"] == 202
    runs = [s for s in spans if s.name == "run"]
    assert len(runs) == 2, [s.name for s in spans]
    assert {s.trace_id for s in runs} == {CLIENT_TRACE}
    assert {s.parent_id for s in runs} == {start[0].span_id}
    # A hand-back on SIGTERM is not an attempt (SPEC §6): both spans are of attempt 1.
    assert [s.attributes["orchestra.attempt"] for s in runs] == [1, 1]
    assert len({s.resource["process.pid"] for s in runs}) == 2  # two processes, one trace
    assert {s.attributes["orchestra.trace_id"] for s in runs} == {trace_id}
    assert sorted(s.attributes["orchestra.outcome"] for s in runs) == ["handback", "succeeded"]
    steps = [s for s in spans if s.name == "step h"]
    assert len(steps) == 2 and {s.trace_id for s in steps} == {CLIENT_TRACE}
    assert {s.parent_id for s in steps} == {s.span_id for s in runs}
    assert all(s.resource["service.name"] == "orchestra-e2e" for s in spans)
