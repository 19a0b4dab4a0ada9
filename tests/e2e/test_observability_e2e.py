"""A real `orchestra serve` with metrics on: `/metrics` read before, during and after a
run shows its life as it happens (queued, in flight, its steps, model and tool calls,
the live stream), and JSON log lines parse."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login, sse_frames
from tests.fakes.fake_llm import FakeLLM
from tests.observability.helpers import value

TOKEN = "scrape-token-123"


@pytest.fixture
def observed(tmp_path):
    fake = FakeLLM()
    fake.start()
    env = {"ORCHESTRA_METRICS": "1", "ORCHESTRA_METRICS_TOKEN": TOKEN, "ORCHESTRA_MAX_RUNS": "1",
           "ORCHESTRA_LOG_FORMAT": "json", "ORCHESTRA_ACCESS_LOG": "1"}
    server = ServerProcess(tmp_path / "home", env=env).start()
    yield server, fake
    server.stop()
    fake.stop()


def scrape(server: ServerProcess) -> str:
    response = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    return response.text


def test_metrics_show_a_run_as_it_happens(observed):
    server, fake = observed
    assert httpx.get(f"{server.base_url}/metrics").status_code == 401
    admin = login(server, "admin", "ADMINISTRATOR")
    http = httpx.Client(base_url=server.base_url + "/api/v1", headers=admin, timeout=15)
    provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                            "model_id": "fake-model", "api_key": "k",
                                            "base_url": fake.base_url})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "calc", "provider_id": provider.json()["provider_id"],
                                              "tools": ["calculator"]})
    wid = worker.json()["worker_id"]
    steps = [
        {"id": "calc", "agent": {"worker": wid}, "prompt": "Compute {{input}}"},
        {"id": "ask", "agent": {"human": True}, "prompt": "Right?", "depends_on": ["calc"]},
    ]
    template = http.post("/workflow/template", json={"name": "two", "steps": steps}).json()["template_id"]
    # Every call of both runs, in the order they come: the first run's answer streams
    # slowly, a word a second, so that it holds the one run slot while it is scraped.
    fake.script_tool_call("calculator", {"expression": "6*7"})
    fake.script_text("The answer is 42.", delay=1.0)
    fake.script_tool_call("calculator", {"expression": "1+1"})
    fake.script_text("2")
    llm = {"provider": "openai_compatible", "outcome": "ok"}

    before = scrape(server)
    assert value(before, "orchestra_runs_in_flight") == 0
    assert value(before, "orchestra_runs_queued") == 0

    first = http.post("/workflow/run", json={"template_id": template, "input": "6*7"},
                      headers={"X-Request-ID": "start-1"})
    assert first.status_code == 202 and first.headers["x-request-id"] == "start-1"
    trace_id = first.json()["trace_id"]
    with http.stream("GET", f"/workflow/sse/{trace_id}") as stream:
        frames = sse_frames(stream)  # kept: a generator closed early closes the stream
        for frame in frames:
            if frame[1] == "token":  # the first word of the slow answer: the call is under way
                break
        # ORCHESTRA_MAX_RUNS=1: a second run waits in the queue behind the running first.
        second = http.post("/workflow/run", json={"template_id": template, "input": "1+1"})
        assert second.status_code == 202
        during = scrape(server)
        assert value(during, "orchestra_sse_subscribers") == 1
        for frame in frames:
            if frame[1] == "reply_requested":
                break
    assert value(during, "orchestra_runs_started_total") == value(before, "orchestra_runs_started_total") + 1
    assert value(during, "orchestra_runs_in_flight") == 1
    assert value(during, "orchestra_runs_queued") == 1
    assert value(during, "orchestra_runs_queued_oldest_seconds") >= 0
    assert value(during, "orchestra_steps_total", status="succeeded") \
        == value(before, "orchestra_steps_total", status="succeeded")
    assert value(during, "orchestra_llm_calls_total", **llm) == value(before, "orchestra_llm_calls_total", **llm) + 1
    assert value(during, "orchestra_llm_call_duration_seconds_count", provider="openai_compatible") \
        == value(before, "orchestra_llm_call_duration_seconds_count", provider="openai_compatible") + 1
    assert value(during, "orchestra_tool_calls_total", tool="calculator", outcome="ok") \
        == value(before, "orchestra_tool_calls_total", tool="calculator", outcome="ok") + 1
    assert value(during, "orchestra_runs_ended_total", status="succeeded") \
        == value(before, "orchestra_runs_ended_total", status="succeeded")
    route = {"method": "POST", "route": "/api/v1/workflow/run", "status": "202"}
    assert value(during, "orchestra_http_requests_total", **route) == 2

    # The first run waits for its reply and gives up its slot: the second is claimed, and
    # asks too. The first is answered and ends; the second is cancelled.
    second_id = second.json()["trace_id"]
    with http.stream("GET", f"/workflow/sse/{second_id}") as stream:
        for frame in sse_frames(stream):
            if frame[1] == "reply_requested":
                break
    assert http.post(f"/workflow/reply/{trace_id}", json={"content": "yes"}).status_code == 200
    assert http.post(f"/workflow/cancel/{second_id}").status_code == 200
    assert http.get(f"/workflow/run/{second_id}").json()["status"] == "cancelled"
    for _ in range(50):
        if http.get(f"/workflow/run/{trace_id}").json()["status"] == "succeeded":
            break
        time.sleep(0.1)
    after = scrape(server)
    assert value(after, "orchestra_runs_ended_total", status="succeeded") \
        == value(before, "orchestra_runs_ended_total", status="succeeded") + 1
    assert value(after, "orchestra_runs_ended_total", status="cancelled") \
        == value(before, "orchestra_runs_ended_total", status="cancelled") + 1
    assert value(after, "orchestra_runs_started_total") == value(before, "orchestra_runs_started_total") + 2
    assert value(after, "orchestra_runs_in_flight") == 0
    assert value(after, "orchestra_runs_queued") == 0
    assert value(after, "orchestra_runs_queued_oldest_seconds") == 0
    assert value(after, "orchestra_sse_subscribers") == 0
    assert value(after, "orchestra_steps_total", status="succeeded") \
        == value(before, "orchestra_steps_total", status="succeeded") + 3
    assert value(after, "orchestra_llm_calls_total", **llm) == value(before, "orchestra_llm_calls_total", **llm) + 4
    assert value(after, "orchestra_llm_tokens_total", provider="openai_compatible", kind="completion") \
        > value(before, "orchestra_llm_tokens_total", provider="openai_compatible", kind="completion")
    assert value(after, "orchestra_tool_calls_total", tool="calculator", outcome="ok") \
        == value(before, "orchestra_tool_calls_total", tool="calculator", outcome="ok") + 2
    assert value(after, "orchestra_lease_renewals_total", outcome="lost") == 0
    assert value(after, "orchestra_store_unavailable_seconds_total") == 0
    assert value(after, "orchestra_password_hash_queue") == 0
    assert trace_id not in after and second_id not in after

    # JSON logs: every line of the server's output from now on is one object.
    server.stop()
    logged = server.log_path.read_text().splitlines()
    start = next(i for i, line in enumerate(logged) if line.startswith("{"))
    # Before the first JSON line: only what `serve` prints on its own (not logging).
    assert not any("INFO" in line for line in logged[:start]), logged[:start]
    lines = [line for line in logged[start:] if not line.startswith(("orchestra listening", "  "))]
    parsed = [json.loads(line) for line in lines]
    access = [p for p in parsed if p["logger"] == "sanic.access"]
    assert access and all({"ts", "level", "msg"} <= set(p) for p in parsed)
    started = [p for p in access if p.get("request_id") == "start-1"]
    assert len(started) == 1 and started[0]["status"] == 202


def wait_until(server: ServerProcess, predicate, what: str, timeout: float = 30.0) -> str:
    """Scrape until `predicate(text)` holds (polling a condition, with a deadline)."""
    import time

    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        text = scrape(server)
        if predicate(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{what}: not seen within {timeout}s; last scrape:\n{text}")


def test_metrics_show_a_store_outage_as_it_happens(tmp_path, postgres_url):
    from urllib.parse import urlparse

    from tests.observability.tcp_proxy import CuttableProxy

    parsed = urlparse(postgres_url)
    proxy = CuttableProxy((parsed.hostname, parsed.port or 5432)).start()
    proxied = parsed._replace(netloc=f"{parsed.username}@127.0.0.1:{proxy.port}").geturl()
    env = {"ORCHESTRA_METRICS": "1", "ORCHESTRA_RUN_LEASE_SECONDS": "1.5"}
    server = ServerProcess(tmp_path / "home", database_url=proxied, env=env).start()
    try:
        user = login(server, "outage")
        http = httpx.Client(base_url=server.base_url + "/api/v1", headers=user, timeout=15)
        steps = [{"id": "h", "agent": {"human": True}, "prompt": "Wait"}]
        tid = http.post("/workflow/template", json={"name": "h", "steps": steps}).json()["template_id"]
        assert http.post("/workflow/run", json={"template_id": tid}).status_code == 202
        before = wait_until(server, lambda t: value(t, "orchestra_lease_renewals_total", outcome="renewed") > 0,
                            "a lease renewal")
        assert value(before, "orchestra_store_down") == 0
        assert value(before, "orchestra_store_unavailable_seconds_total") == 0

        proxy.cut()
        down = wait_until(server, lambda t: value(t, "orchestra_store_down") == 1
                          and value(t, "orchestra_store_unavailable_seconds_total") > 0, "the outage")
        assert "orchestra_runs_queued " not in down  # the store's own gauges: not without it
        later = wait_until(
            server, lambda t: value(t, "orchestra_store_unavailable_seconds_total")
            > value(down, "orchestra_store_unavailable_seconds_total") + 1, "the outage growing")
        assert value(later, "orchestra_lease_renewals_total", outcome="failed") \
            > value(before, "orchestra_lease_renewals_total", outcome="failed")

        proxy.restore()
        up = wait_until(server, lambda t: value(t, "orchestra_store_down") == 0 and "orchestra_runs_queued " in t,
                        "the store back")
        total = value(up, "orchestra_store_unavailable_seconds_total")
        assert total >= value(later, "orchestra_store_unavailable_seconds_total")
        again = scrape(server)
        assert value(again, "orchestra_store_unavailable_seconds_total") == total  # stopped growing
    finally:
        server.stop()
        proxy.stop()


def test_workers_sharing_a_port_report_together(tmp_path, postgres_url):
    """`--workers 2`: whichever worker answers a scrape counts every worker's requests."""
    server = ServerProcess(tmp_path / "home", database_url=postgres_url,
                           env={"ORCHESTRA_METRICS": "1", "ORCHESTRA_WORKERS": "2"}).start(timeout=60)
    try:
        for _ in range(40):  # a new connection each: the workers share them out
            assert httpx.get(f"{server.base_url}/api/v1/workflow/run").status_code == 401
        route = {"method": "GET", "route": "/api/v1/workflow/run", "status": "401"}
        for _ in range(6):  # any worker may answer the scrape: each must see all 40
            assert value(scrape_open(server), "orchestra_http_requests_total", **route) == 40
    finally:
        server.stop()


def scrape_open(server: ServerProcess) -> str:
    response = httpx.get(f"{server.base_url}/metrics")
    assert response.status_code == 200, response.text
    return response.text
