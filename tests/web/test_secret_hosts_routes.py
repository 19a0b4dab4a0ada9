"""Secrets go only where they were entered for (SPEC §15b), through the API, against real
loopback HTTP servers: the issue's reproduction (a user's template sending an
administrator's secret to the user's own host, in the URL and a header) is refused at
save and, when the host comes from the run's data, at run time before any byte leaves;
saves and `template/check` answer alike for a secret that does not exist and one that
may not go there; a cross-host redirect drops the headers that carried a secret and a
redirect URL carrying one fails the step; encoded forms of a value are redacted."""

from __future__ import annotations

import itertools
import json
from urllib.parse import quote, quote_plus

import pytest

from orchestra.db.models import RunEvent, RunStep
from orchestra.testing.fake_http import FakeHttp
from tests.conftest import LOOPBACK_STEPS
from tests.web.test_workflow_routes import API, wait_for

SECRETS = "/api/v1/resource/secret"
TOKEN = "adm-tok/9f8e 7d6c+5b4a=3210"  # characters a URL encodes: / space + =
NAMES = itertools.count()
LEAKED = "adm-key/0a1b 2c3d=4e5f"
API_HOST = "api.admin.example"


@pytest.fixture(scope="module")
def evil():
    with FakeHttp() as server:  # the user's own host: it must see nothing
        yield server


@pytest.fixture(scope="module")
def good():
    with FakeHttp() as server:  # where the secret was entered for
        yield server


@pytest.fixture
def settings_overrides():
    return dict(LOOPBACK_STEPS)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


async def store(client, admin, name: str, hosts: list[str], value: str = TOKEN) -> None:
    made = await client.post(SECRETS, json={"name": name, "value": value, "hosts": hosts}, headers=admin["headers"])
    assert made.status_code == 201, made.text


def reproduction(url: str, name: str = "ADMIN_TOKEN") -> list[dict]:
    """The issue's template: the secret in the URL and in a header, to the user's host."""
    ref = "{{ secrets." + name + " }}"
    return [{"id": "take", "http": {"method": "GET", "url": url + "/echo?k=" + ref, "headers": {"X-K": ref}}}]


async def run_of(client, who, steps, input="x") -> dict:
    made = await client.post(f"{API}/template", headers=who["headers"],
                             json={"name": f"t{next(NAMES)}", "steps": steps})
    assert made.status_code == 201, made.text
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": made.json()["template_id"], "input": input})
    assert started.status_code in (200, 201, 202), started.text
    return await wait_for(client, who, started.json()["trace_id"], "succeeded", "failed", timeout=20)


async def stored_text(client, trace_id: str) -> str:
    db = client.app.ctx.core.db
    events = [[e.kind, e.data] for e in await db.list(RunEvent.select().where(RunEvent.run == trace_id))]
    rows = [[r.output, r.error] for r in await db.list(RunStep.select().where(RunStep.run == trace_id))]
    return json.dumps(events + rows)


async def test_the_reproduction_is_refused_at_save_alike_for_a_missing_secret(client, admin, alice, evil):
    await store(client, admin, "ADMIN_TOKEN", [API_HOST])
    answers = {}
    for name in ("ADMIN_TOKEN", "NO_SUCH_SECRET"):
        steps = reproduction(evil.url, name)
        saved = await client.post(f"{API}/template", headers=alice["headers"], json={"name": "t", "steps": steps})
        assert saved.status_code == 422, saved.text
        checked = await client.post(f"{API}/template/check", headers=alice["headers"], json={"name": "t", "steps": steps})
        assert checked.status_code == 200 and checked.json()["valid"] is False
        answers[name] = (saved.json()["detail"], checked.json()["problems"])
        assert [d["field"] for d in saved.json()["detail"]] == ["steps.0.http.url", "steps.0.http.headers.X-K"]
        assert f"the secret '{name}' may not be sent to 127.0.0.1:{evil.port}" in saved.json()["detail"][0]["problem"]
    # one answer whether the secret exists or not: nothing tells which names exist
    assert json.dumps(answers["ADMIN_TOKEN"]).replace("ADMIN_TOKEN", "N") == \
        json.dumps(answers["NO_SUCH_SECRET"]).replace("NO_SUCH_SECRET", "N")
    assert evil.hits["/echo"] == 0
    # the administrator's own template to the secret's host is fine
    fine = await client.post(f"{API}/template/check", headers=alice["headers"],
                             json={"name": "t", "steps": reproduction(f"https://{API_HOST}")})
    assert fine.json()["valid"] is True, fine.text


async def test_a_host_from_the_runs_data_is_refused_at_run_time_before_any_byte(client, admin, alice, evil):
    await store(client, admin, "ADMIN_TOKEN", [API_HOST])
    before = len(evil.requests)
    steps = [{"id": "take", "http": {"method": "GET", "url": "{{ input }}/echo?k={{ secrets.ADMIN_TOKEN }}",
                                     "headers": {"X-K": "{{ secrets.ADMIN_TOKEN }}"}}}]
    missing = [{"id": "take", "http": {"method": "GET", "url": "{{ input }}/echo?k={{ secrets.NOPE }}"}}]
    for template in (steps, missing):  # both save: the host is not known before the run
        checked = await client.post(f"{API}/template/check", headers=alice["headers"], json={"name": "t", "steps": template})
        assert checked.json()["valid"] is True, checked.text
    run = await run_of(client, alice, steps, input=evil.url)
    assert run["status"] == "failed"
    assert f"the secret 'ADMIN_TOKEN' may not be sent to 127.0.0.1:{evil.port}" in run["error"], run["error"]
    gone = await run_of(client, alice, missing, input=evil.url)
    assert gone["status"] == "failed"
    assert run["error"].replace("ADMIN_TOKEN", "N") == gone["error"].replace("NOPE", "N")
    assert len(evil.requests) == before  # no request reached the user's host
    assert TOKEN not in await stored_text(client, run["trace_id"])


async def test_a_secret_reaches_its_host_and_a_cross_host_redirect_drops_its_header(client, admin, alice, good, evil):
    await store(client, admin, "API_KEY", ["127.0.0.1"])  # any port of 127.0.0.1; `localhost` is another host
    target = evil.url.replace("127.0.0.1", "localhost")
    steps = [
        {"id": "direct", "http": {"method": "GET", "url": good.url + "/echo",
                                  "headers": {"X-K": "{{ secrets.API_KEY }}", "X-Other": "kept"}}},
        {"id": "same_host", "depends_on": ["direct"], "http": {
            "method": "GET", "url": good.url + "/redirect?to=" + quote(good.url + "/echo?same=1", safe=""),
            "headers": {"X-K": "{{ secrets.API_KEY }}"}}},
        {"id": "cross_host", "depends_on": ["same_host"], "http": {
            "method": "GET", "url": good.url + "/redirect?to=" + quote(target + "/echo?cross=1", safe=""),
            "headers": {"X-K": "Key {{ secrets.API_KEY }}", "X-Other": "kept"}}},
    ]
    before = len(evil.requests)
    run = await run_of(client, alice, steps)
    assert run["status"] == "succeeded", run.get("error")
    sent = [r for r in good.requests if r["path"] == "/echo"][-2:]
    assert [r["headers"].get("x-k") for r in sent] == [TOKEN, TOKEN]  # direct, and a same-host redirect
    arrived = evil.requests[before:]
    assert len(arrived) == 1 and "x-k" not in arrived[0]["headers"]  # the redirect arrived without it
    assert arrived[0]["headers"]["x-other"] == "kept"
    assert TOKEN not in await stored_text(client, run["trace_id"])


async def test_a_redirect_url_carrying_the_secret_elsewhere_fails_the_step(client, admin, alice, good, evil):
    # no '+' in this value: the echoing server's query parsing would turn it into a space
    await store(client, admin, "API_KEY", [f"127.0.0.1:{good.port}"], value=LEAKED)
    target = evil.url.replace("127.0.0.1", "localhost")
    # the allowed host answers with a redirect that would carry the key (percent-encoded) to another host
    steps = [{"id": "leak", "http": {
        "method": "GET",
        "url": good.url + "/redirect?to=" + quote(target, safe="") + "%2Fecho%3Fk%3D{{ secrets.API_KEY }}"}}]
    before = len(evil.requests)
    run = await run_of(client, alice, steps)
    assert run["status"] == "failed"
    assert f"the secret 'API_KEY' may not be sent to localhost:{evil.port}" in run["error"], run["error"]
    assert "after a redirect" in run["error"]
    assert len(evil.requests) == before
    text = await stored_text(client, run["trace_id"])
    for form in (LEAKED, quote(LEAKED, safe=""), quote_plus(LEAKED), quote(LEAKED)):
        assert form not in text and form not in run["error"], form


async def test_encoded_forms_of_a_value_are_redacted_in_errors_and_events(client, admin, alice, good):
    await store(client, admin, "API_KEY", ["127.0.0.1"])
    steps = [{"id": "fails", "http": {"method": "GET", "url": good.url + "/status/500?k={{ secrets.API_KEY }}",
                                      "headers": {"X-K": "{{ secrets.API_KEY }}"}}}]
    run = await run_of(client, alice, steps)
    assert run["status"] == "failed" and "HTTP 500" in run["error"], run["error"]
    text = await stored_text(client, run["trace_id"]) + json.dumps(run)
    for form in (TOKEN, quote(TOKEN, safe=""), quote_plus(TOKEN), quote(TOKEN), quote(TOKEN, safe="").lower()):
        assert form not in text, form
    assert "k=***" in run["error"]


async def test_a_secret_stored_before_hosts_is_unusable_until_its_hosts_are_set(client, admin, alice, good):
    from orchestra.db.models import Secret

    await store(client, admin, "OLD", ["placeholder.example"])
    await client.app.ctx.core.db.aexecute(Secret.update(hosts=None).where(Secret.name == "OLD"))  # as upgraded
    listed = (await client.get(SECRETS, headers=admin["headers"])).json()["secrets"]
    assert listed[0]["hosts"] is None
    steps = [{"id": "a", "http": {"method": "GET", "url": good.url + "/echo", "headers": {"X-K": "{{ secrets.OLD }}"}}}]
    refused = await client.post(f"{API}/template", headers=alice["headers"], json={"name": "t", "steps": steps})
    assert refused.status_code == 422 and "the secret 'OLD' may not be sent" in refused.text
    set_hosts = await client.put(f"{SECRETS}/OLD", json={"hosts": ["127.0.0.1"]}, headers=admin["headers"])
    assert set_hosts.status_code == 200 and set_hosts.json()["hosts"] == ["127.0.0.1"]
    run = await run_of(client, alice, steps)
    assert run["status"] == "succeeded", run.get("error")
    assert [r for r in good.requests if r["path"] == "/echo"][-1]["headers"]["x-k"] == TOKEN
