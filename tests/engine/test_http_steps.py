"""HTTP steps (SPEC §14) against a real HTTP server on loopback: the answer as
`{status, headers, body}`, JSON usable downstream, secrets sent where they were entered
for and `***` everywhere else, status >= 400 / oversized answers / refused addresses
failing the step with a readable error, Retry-After honoured between attempts."""

from __future__ import annotations

import json

import pytest

from orchestra.db.models import RunEvent, RunStep, WorkflowRun
from orchestra.services import auth, secrets
from orchestra.testing.fake_http import FakeHttp
from tests.engine.test_engine import events, start, wait_status

SECRET = "tok-9f8e7d6c5b4a3210"
SETTING = "ORCHESTRA_STEP_EGRESS_ALLOW"


@pytest.fixture(scope="module")
def target():
    with FakeHttp() as server:
        yield server


@pytest.fixture
def settings_overrides(target):
    return {"step_egress_allow": f"127.0.0.1:{target.port}"}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def owner(core) -> dict:
    user = await auth.register(core, user_name="alice", password="password-123")
    # every host the refused-address cases name: the egress rule, not the secret's hosts, refuses them
    await secrets.create_secret(core, name="API_TOKEN", value=SECRET, hosts=[
        "127.0.0.1", "127.0.0.2", "::1", "10.1.2.3", "169.254.169.254", "localhost"])
    return {"user_id": user.id}


async def everything_stored(core, trace_id: str) -> str:
    """Every event, step row and the run row of a run, as one text."""
    evs = await core.db.list(RunEvent.select().where(RunEvent.run == trace_id))
    rows = await core.db.list(RunStep.select().where(RunStep.run == trace_id))
    run = await WorkflowRun.aget(WorkflowRun.trace_id == trace_id)
    return json.dumps([[e.kind, e.data] for e in evs] + [
        [r.output, r.output_value, r.error] for r in rows] + [run.error])


async def test_an_answer_is_the_output_and_its_json_is_usable_downstream(core, target):
    who = await owner(core)
    steps = [
        {"id": "a", "http": {"method": "GET", "url": target.url + "/echo?who={{ input }}",
                             "headers": {"Authorization": "Bearer {{ secrets.API_TOKEN }}"}}},
        {"id": "b", "depends_on": ["a"], "http": {
            "method": "POST", "url": target.url + "/echo",
            "body": {"seen": "{{ steps.a.output.body.query }}", "text": "status {{ steps.a.output.status }}"}}},
    ]
    trace_id = await start(core, who, steps, input="bob")
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    rows = {r.step_id: r for r in await core.db.list(RunStep.select().where(RunStep.run == trace_id))}
    a = rows["a"].output_value
    assert a["status"] == 200 and a["body"]["query"] == {"who": "bob"}
    # the server got the secret; the output shows *** where it echoed it (body and header)
    assert target.requests[-2]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert a["body"]["headers"]["authorization"] == "Bearer ***"
    assert a["headers"]["x-echo-authorization"] == "Bearer ***"
    b = rows["b"].output_value
    assert json.loads(b["body"]["body"]) == {"seen": {"who": "bob"}, "text": "status 200"}
    assert b["body"]["headers"]["content-type"] == "application/json"
    stored = await everything_stored(core, trace_id)
    assert SECRET not in stored and "Bearer ***" in stored


async def test_error_statuses_and_large_answers_fail_the_step(core, target):
    who = await owner(core)
    trace_id = await start(core, who, [
        {"id": "bad", "on_error": "continue", "http": {"method": "GET", "url": target.url + "/status/500"}},
        {"id": "big", "on_error": "continue", "http": {"method": "GET", "url": target.url + "/big/1048577"}},
        {"id": "fits", "http": {"method": "GET", "url": target.url + "/big/1048576"}},
        # no Content-Length: the size is known only once read past the limit
        {"id": "big_chunked", "on_error": "continue",
         "http": {"method": "GET", "url": target.url + "/big/3000000?chunked=1"}},
        {"id": "fits_chunked", "http": {"method": "GET", "url": target.url + "/big/1048576?chunked=1"}},
        {"id": "text", "http": {"method": "GET", "url": target.url + "/text"}},
    ])
    run = await wait_status(core, trace_id, "succeeded", "failed")
    assert run.status == "succeeded", run.error
    rows = {r.step_id: r for r in await core.db.list(RunStep.select().where(RunStep.run == trace_id))}
    assert rows["bad"].status == "failed" and "HTTP 500" in rows["bad"].error and "status 500" in rows["bad"].error
    assert rows["big"].status == "failed" and "larger than 1048576 bytes" in rows["big"].error
    assert rows["fits"].status == "succeeded" and len(rows["fits"].output_value["body"]) == 1048576
    assert rows["text"].output_value["body"] == "plain text ✓"
    assert rows["big_chunked"].status == "failed" and "larger than 1048576 bytes" in rows["big_chunked"].error
    assert rows["fits_chunked"].status == "succeeded" and len(rows["fits_chunked"].output_value["body"]) == 1048576


async def test_a_429_makes_the_next_attempt_wait_its_retry_after(core, target):
    who = await owner(core)
    trace_id = await start(core, who, [{"id": "a", "retry": {"max_attempts": 2, "backoff_seconds": 0},
                                        "http": {"method": "GET", "url": target.url + "/status/429?retry_after=1"}}])
    run = await wait_status(core, trace_id, "failed", "succeeded", timeout=15)
    assert run.status == "failed" and "HTTP 429" in run.error
    evs = await events(core, trace_id)
    retrying = [e for e in evs if e.kind == "step_retrying"]
    assert len(retrying) == 1 and retrying[0].data["delay_seconds"] >= 1
    asked = [r["at"] for r in target.requests if r["path"] == "/status/429"][-2:]
    assert len(asked) == 2 and asked[1] - asked[0] >= 1  # as the server saw them


@pytest.mark.parametrize("url, shown", [
    ("http://127.0.0.2:{port}/echo", "127.0.0.2"),
    ("http://[::1]:{port}/echo", "::1"),
    ("http://10.1.2.3:{port}/echo", "10.1.2.3"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
    ("http://localhost:1/echo", "localhost"),  # a name resolving to loopback, not allowed there
    ("http://127.0.0.1:{port}/redirect?to=http://127.0.0.1:1/echo", "127.0.0.1:1"),
])
async def test_refused_addresses_fail_the_step_naming_the_rule(core, target, url, shown):
    who = await owner(core)
    url = url.format(port=target.port)
    trace_id = await start(core, who, [{"id": "a", "http": {
        "method": "GET", "url": url + ("&" if "?" in url else "?") + "k={{ secrets.API_TOKEN }}",
        "headers": {"X-Key": "{{ secrets.API_TOKEN }}"}}}])
    run = await wait_status(core, trace_id, "failed", "succeeded", timeout=15)
    assert run.status == "failed"
    assert "egress rule" in run.error and SETTING in run.error and shown in run.error, run.error
    stored = await everything_stored(core, trace_id)
    assert SECRET not in stored and "k=***" in stored


async def test_a_cookie_one_users_step_was_given_never_goes_with_another_users_call(core, target):
    alice = await owner(core)
    bob = {"user_id": (await auth.register(core, user_name="bob", password="password-123")).id}
    given = await start(core, alice, [{"id": "a", "http": {
        "method": "GET", "url": target.url + "/cookie?set=session%3Dalice-only"}}])
    assert (await wait_status(core, given, "succeeded", "failed")).status == "succeeded"
    assert target.requests[-1]["path"] == "/cookie"
    # bob's call to the same host, and alice's own next call, carry no cookie
    for who in (bob, alice):
        sent = await start(core, who, [{"id": "b", "http": {"method": "GET", "url": target.url + "/echo"}}])
        run = await wait_status(core, sent, "succeeded", "failed")
        assert run.status == "succeeded", run.error
        assert target.requests[-1]["path"] == "/echo"
        assert "cookie" not in target.requests[-1]["headers"]
    # a Cookie header the step names is sent as written
    named = await start(core, bob, [{"id": "c", "http": {"method": "GET", "url": target.url + "/echo",
                                                          "headers": {"Cookie": "mine=1"}}}])
    assert (await wait_status(core, named, "succeeded", "failed")).status == "succeeded"
    assert target.requests[-1]["headers"]["cookie"] == "mine=1"
