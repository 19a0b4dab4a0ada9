"""`GET /metrics` (on, off, with a token), request metrics by route template, and
`X-Request-ID` on every kind of response."""

from __future__ import annotations

import re

import pytest

from tests.conftest import running_app
from tests.observability.helpers import scrape, value
from tests.web.test_workflow_routes import API, human, make_template, wait_for

pytestmark = pytest.mark.asyncio


@pytest.fixture
def settings_overrides() -> dict:
    return {"metrics": True}


async def test_metrics_off_is_a_json_404(tmp_path, database_url):
    from tests.conftest import make_settings

    async with running_app(make_settings(tmp_path / "off", database_url)) as client:
        response = await client.get("/metrics")
        assert response.status_code == 404
        assert response.json()["error"] == "NotFoundError"


async def test_metrics_token_is_required_when_set(tmp_path, database_url):
    from tests.conftest import make_settings

    settings = make_settings(tmp_path / "tok", database_url, metrics=True, metrics_token="s3cret-token")
    async with running_app(settings) as client:
        missing = await client.get("/metrics")
        assert missing.status_code == 401 and missing.json()["error"] == "AuthenticationRequiredError"
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"] == "TokenInvalidError"
        basic = await client.get("/metrics", headers={"Authorization": "Basic s3cret-token"})
        assert basic.status_code == 401
        text = await scrape(client, "s3cret-token")
        assert "orchestra_http_requests_total" in text


async def test_requests_are_counted_by_route_template_never_by_raw_id(client, users):
    alice = await users.make("alice")
    raw_id = "0123456789abcdef0123456789abcdef"
    before = await scrape(client)
    route = "/api/v1/workflow/run/{trace_id}"
    for _ in range(2):
        response = await client.get(f"{API}/run/{raw_id}", headers=alice["headers"])
        assert response.status_code == 404
    unknown = await client.get(f"/no/such/{raw_id}")
    assert unknown.status_code == 404
    after = await scrape(client)
    assert raw_id not in after
    assert value(after, "orchestra_http_requests_total", method="GET", route=route, status="404") \
        == value(before, "orchestra_http_requests_total", method="GET", route=route, status="404") + 2
    assert value(after, "orchestra_http_requests_total", method="GET", route="unmatched", status="404") \
        == value(before, "orchestra_http_requests_total", method="GET", route="unmatched", status="404") + 1
    assert value(after, "orchestra_http_request_duration_seconds_count", method="GET", route=route) \
        == value(before, "orchestra_http_request_duration_seconds_count", method="GET", route=route) + 2


async def test_every_metric_of_the_spec_is_exposed(client):
    text = await scrape(client)
    for name in (
        "orchestra_http_requests_total", "orchestra_http_request_duration_seconds",
        "orchestra_runs_started_total", "orchestra_runs_ended_total", "orchestra_runs_in_flight",
        "orchestra_runs_queued", "orchestra_steps_total", "orchestra_llm_calls_total",
        "orchestra_llm_call_duration_seconds", "orchestra_llm_tokens_total", "orchestra_tool_calls_total",
        "orchestra_sse_subscribers", "orchestra_lease_renewals_total",
        "orchestra_store_unavailable_seconds_total", "orchestra_password_hash_queue",
    ):
        assert re.search(rf"^# TYPE {name} (counter|gauge|histogram)$", text, re.M), name


HEX32 = re.compile(r"[0-9a-f]{32}")


async def test_request_id_is_echoed_when_sane_and_generated_otherwise(client, users):
    alice = await users.make("alice")
    given = "req-42.client:a/b+c=d@e"
    ok = await client.get(f"{API}/run", headers={**alice["headers"], "X-Request-ID": given})
    assert ok.status_code == 200 and ok.headers["x-request-id"] == given
    for bad in ("has space", "x" * 129, "semi;colon", "tab\there", "é".encode(), "<script>"):
        response = await client.get(f"{API}/run", headers={**alice["headers"], "X-Request-ID": bad})
        assert response.status_code == 200
        assert HEX32.fullmatch(response.headers["x-request-id"]), bad
    plain = await client.get(f"{API}/run", headers=alice["headers"])
    other = await client.get(f"{API}/run", headers=alice["headers"])
    assert HEX32.fullmatch(plain.headers["x-request-id"])
    assert plain.headers["x-request-id"] != other.headers["x-request-id"]


async def test_errors_console_and_head_carry_a_request_id(client):
    unauthorised = await client.get(f"{API}/run", headers={"X-Request-ID": "e-1"})
    assert unauthorised.status_code == 401 and unauthorised.headers["x-request-id"] == "e-1"
    missing = await client.get("/nothing/here", headers={"X-Request-ID": "e-2"})
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "e-2"
    wrong_method = await client.delete(f"{API}/run", headers={"X-Request-ID": "e-3"})
    assert wrong_method.status_code == 405 and wrong_method.headers["x-request-id"] == "e-3"
    bad_json = await client.post("/api/v1/auth/login", content=b"{nope",
                                 headers={"X-Request-ID": "e-4", "Content-Type": "application/json"})
    assert bad_json.status_code in (400, 422) and bad_json.headers["x-request-id"] == "e-4"
    console = await client.get("/", headers={"X-Request-ID": "c-1"})
    assert console.status_code == 200 and console.headers["x-request-id"] == "c-1"
    head = await client.head(f"{API}/run", headers={"X-Request-ID": "h-1"})
    assert head.status_code == 401 and head.headers["x-request-id"] == "h-1"


async def test_an_event_stream_carries_a_request_id(client, users):
    """(A live stream, and the subscriber gauge, are read from a real server in
    tests/e2e/test_observability_e2e.py: the in-process client buffers whole responses.)"""
    alice = await users.make("alice")
    template = (await make_template(client, alice, [human()]))["template_id"]
    run = await client.post(f"{API}/run", headers=alice["headers"], json={"template_id": template})
    trace_id = run.json()["trace_id"]
    await wait_for(client, alice, trace_id, "waiting_reply")
    reply = await client.post(f"{API}/reply/{trace_id}", headers=alice["headers"], json={"content": "Ada"})
    assert reply.status_code == 200
    await wait_for(client, alice, trace_id, "succeeded")
    stream = await client.get(f"{API}/sse/{trace_id}", headers={**alice["headers"], "X-Request-ID": "sse-1"})
    assert stream.status_code == 200 and stream.headers["x-request-id"] == "sse-1"
    assert "event: run_finished" in stream.text
    done = await client.get(f"{API}/sse/{trace_id}", headers={**alice["headers"], "X-Request-ID": "sse-2",
                                                              "Last-Event-ID": "999"})
    assert done.status_code == 204 and done.headers["x-request-id"] == "sse-2"
