"""Rights at the moment of use (SPEC §15b), in process, on both stores: a shared
template is changed, restored or deleted by ADMINISTRATOR+ only (its owner demoted since
sharing it included); a fork by anyone but the run's owner may not set `version`,
`input` or `outputs`; save-time cycle checks follow a child's pinned version."""

from __future__ import annotations

import asyncio

import pytest

API = "/api/v1"
WF = f"{API}/workflow"
ASK = [{"id": "ask", "agent": {"human": True}, "prompt": "Name for {{input}}?"}]


@pytest.fixture
def database_url(both_stores: str) -> str:
    return both_stores


def assert_error(response, status: int, error: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == error, response.text


async def demote(client, root: dict, who: dict) -> None:
    demoted = await client.put(f"{API}/auth/authority", headers=root["headers"],
                               json={"user_id": who["user_id"], "new_authority": "USER"})
    assert demoted.status_code == 200, demoted.text


async def test_a_demoted_owner_can_no_longer_change_their_shared_template(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    dora = await users.make("dora", "ADMINISTRATOR")
    made = await client.post(f"{WF}/template", headers=dora["headers"],
                             json={"name": "house", "steps": ASK, "shared": True})
    assert made.status_code == 201, made.text
    tid = made.json()["template_id"]
    changed = await client.put(f"{WF}/template/{tid}", headers=dora["headers"],
                               json={"name": "house", "steps": ASK, "description": "v2"})
    assert changed.status_code == 200, changed.text  # an administrator may

    await demote(client, root, dora)  # her token still says ADMINISTRATOR
    body = {"name": "house", "steps": ASK, "description": "collects what others run"}
    assert_error(await client.put(f"{WF}/template/{tid}", headers=dora["headers"], json=body),
                 403, "PermissionDeniedError")
    assert_error(await client.post(f"{WF}/template/{tid}/versions/1/restore", headers=dora["headers"]),
                 403, "PermissionDeniedError")
    assert_error(await client.delete(f"{WF}/template/{tid}", headers=dora["headers"]),
                 403, "PermissionDeniedError")
    stored = (await client.get(f"{WF}/template/{tid}", headers=dora["headers"])).json()
    assert stored["template"]["description"] == "v2" and stored["template"]["version"] == 2
    # she still reads and runs it, and her own private templates stay hers to change
    assert (await client.post(f"{WF}/run", headers=dora["headers"],
                              json={"template_id": tid, "input": "x"})).status_code == 202
    own = await client.post(f"{WF}/template", headers=dora["headers"], json={"name": "mine", "steps": ASK})
    assert (await client.put(f"{WF}/template/{own.json()['template_id']}", headers=dora["headers"],
                             json={"name": "mine", "steps": ASK, "description": "ok"})).status_code == 200
    # an administrator still may
    assert (await client.delete(f"{WF}/template/{tid}", headers=root["headers"])).status_code == 200


async def wait_status(client, who: dict, trace_id: str, *wanted: str) -> dict:
    for _ in range(500):
        body = (await client.get(f"{WF}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in wanted:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"{trace_id} stayed {body['status']}")


async def test_a_fork_by_another_than_the_owner_sets_no_version_input_or_outputs(client, users):
    owner = await users.make("owner")
    admin = await users.make("admin", "ADMINISTRATOR")
    made = await client.post(f"{WF}/template", headers=owner["headers"], json={"name": "t", "steps": ASK})
    tid = made.json()["template_id"]
    started = await client.post(f"{WF}/run", headers=owner["headers"], json={"template_id": tid, "input": "x"})
    trace_id = started.json()["trace_id"]
    await wait_status(client, owner, trace_id, "waiting_reply")
    await client.post(f"{WF}/reply/{trace_id}", headers=owner["headers"], json={"content": "Ada"})
    await wait_status(client, owner, trace_id, "succeeded")

    fork = f"{WF}/run/{trace_id}/fork"
    for body in ({"version": 1}, {"input": "chosen by the admin"}, {"outputs": {"ask": "forged"}}):
        refused = await client.post(fork, headers=admin["headers"], json=body)
        assert_error(refused, 403, "PermissionDeniedError")
        assert next(iter(body)) in refused.json()["message"]
    # a plain fork by the administrator is allowed (it is the owner's run), and the owner
    # may set all three
    plain = await client.post(fork, headers=admin["headers"], json={"from_step": "ask"})
    assert plain.status_code == 202, plain.text
    own = await client.post(fork, headers=owner["headers"],
                            json={"version": 1, "input": "y", "outputs": {"ask": "Bea"}})
    assert own.status_code == 202, own.text
    assert (await wait_status(client, owner, own.json()["trace_id"], "succeeded"))["output"] == "Bea"


async def test_a_child_pinned_to_a_version_that_calls_back_is_a_cycle(client, users):
    alice = await users.make("alice")
    h = alice["headers"]
    a = (await client.post(f"{WF}/template", headers=h, json={"name": "a", "steps": ASK})).json()["template_id"]
    b_steps = [{"id": "child", "workflow": {"template": a, "input": "input"}}]
    b = (await client.post(f"{WF}/template", headers=h, json={"name": "b", "steps": b_steps})).json()["template_id"]
    # a v2 calls b; a v3 calls nothing again
    calls_b = [{"id": "child", "workflow": {"template": b, "input": "input"}}]
    refused = await client.put(f"{WF}/template/{a}", headers=h, json={"name": "a", "steps": calls_b})
    assert refused.status_code == 422, refused.text  # b calls a (its latest): a cycle, as before
    # b now calls nothing; a v2 calls b; a v3 calls nothing
    assert (await client.put(f"{WF}/template/{b}", headers=h, json={"name": "b", "steps": ASK})).status_code == 200
    assert (await client.put(f"{WF}/template/{a}", headers=h, json={"name": "a", "steps": calls_b})).status_code == 200
    assert (await client.put(f"{WF}/template/{a}", headers=h, json={"name": "a", "steps": ASK})).status_code == 200
    # b calling a pinned to v2 (which calls b): a cycle, though a's latest calls nothing
    pinned = [{"id": "child", "workflow": {"template": a, "version": 2, "input": "input"}}]
    answer = await client.put(f"{WF}/template/{b}", headers=h, json={"name": "b", "steps": pinned})
    assert_error(answer, 422, "ValidationError")
    assert any("calls this template" in p["problem"] for p in answer.json()["detail"]), answer.text
    assert (await client.get(f"{WF}/template/{b}", headers=h)).json()["template"]["version"] == 2
    # pinned to v3 (no calls) or v1 (no calls) is fine
    for version in (1, 3):
        ok = [{"id": "child", "workflow": {"template": a, "version": version, "input": "input"}}]
        saved = await client.put(f"{WF}/template/{b}", headers=h, json={"name": "b", "steps": ok})
        assert saved.status_code == 200, saved.text


@pytest.fixture
def settings_overrides() -> dict:
    return {"foreach_max_items": 3, "step_egress_allow": "127.0.0.1"}


async def test_fork_outputs_are_checked_by_the_steps_kind(client, users):
    alice = await users.make("alice")
    h = alice["headers"]
    shaped = {"name": "shaped", "steps": ASK, "output_schema": {"type": "object", "required": ["n"]}}
    shaped_id = (await client.post(f"{WF}/template", headers=h, json=shaped)).json()["template_id"]
    plain_id = (await client.post(f"{WF}/template", headers=h, json={"name": "plain", "steps": ASK})).json()["template_id"]
    get = {"method": "GET", "url": "http://127.0.0.1:9/nothing", "timeout_seconds": 1}
    steps = [
        {"id": "call", "http": get, "on_error": "continue"},
        {"id": "hits", "foreach": {"items": "[1, 2]"}, "http": get, "on_error": "continue"},
        {"id": "asks", "foreach": {"items": "[1, 2]"}, "agent": {"human": True}, "prompt": "n?",
         "output_schema": {"type": "integer"}, "on_error": "continue"},
        {"id": "texts", "foreach": {"items": "[1]"}, "agent": {"human": True}, "prompt": "t?"},
        {"id": "kid", "workflow": {"template": shaped_id, "input": "input"}},
        {"id": "free", "workflow": {"template": plain_id, "input": "input"}},
    ]
    made = await client.post(f"{WF}/template", headers=h, json={"name": "kinds", "steps": steps})
    assert made.status_code == 201, made.text
    started = await client.post(f"{WF}/run", headers=h, json={"template_id": made.json()["template_id"], "input": "x"})
    fork = f"{WF}/run/{started.json()['trace_id']}/fork"

    async def refused(outputs: dict) -> list[dict]:
        answer = await client.post(fork, headers=h, json={"outputs": outputs})
        assert_error(answer, 422, "ValidationError")
        return answer.json()["detail"]

    http_ok = {"status": 200, "headers": {"content-type": "text/plain"}, "body": "hi"}
    # an HTTP step: {status, headers, body}, status < 400, headers of strings
    assert (await refused({"call": "plain text"}))[0]["field"] == "outputs.call"
    assert {p["field"] for p in await refused({"call": {"status": 200}})} == {
        "outputs.call.headers", "outputs.call.body"}
    assert (await refused({"call": {**http_ok, "status": 500}}))[0]["field"] == "outputs.call.status"
    assert (await refused({"call": {**http_ok, "headers": {"x": 1}}}))[0]["field"] == "outputs.call.headers"
    assert (await refused({"call": {**http_ok, "extra": 1}}))[0]["field"] == "outputs.call.extra"
    # a foreach: a list within the item limit, each item of the inner call's kind
    assert (await refused({"hits": http_ok}))[0]["field"] == "outputs.hits"
    assert "ORCHESTRA_FOREACH_MAX_ITEMS" in (await refused({"hits": [http_ok] * 4}))[0]["problem"]
    assert (await refused({"hits": [http_ok, "text"]}))[0]["field"] == "outputs.hits.1"
    assert (await refused({"asks": [1, "two"]}))[0]["field"] == "outputs.asks.1"
    assert (await refused({"texts": [None]}))[0]["field"] == "outputs.texts.0"  # on_error: fail
    # a workflow step: the child template's output_schema (any JSON value without one)
    assert (await refused({"kid": "text"}))[0]["field"] == "outputs.kid"
    assert (await refused({"kid": {"m": 1}}))[0]["field"].startswith("outputs.kid")

    good = {"call": http_ok, "hits": [http_ok, None], "asks": [1, None], "texts": ["t"],
            "kid": {"n": 1}, "free": {"any": ["json"]}}
    forked = await client.post(fork, headers=h, json={"outputs": good})
    assert forked.status_code == 202, forked.text
    done = await wait_status(client, alice, forked.json()["trace_id"], "succeeded")
    assert done["output"] == {"any": ["json"]}
    assert {s["step_id"]: s["output"] for s in done["steps"]}["hits"] == [http_ok, None]
    cancelled = await client.post(f"{WF}/cancel/{started.json()['trace_id']}", headers=h)
    assert cancelled.status_code == 200, cancelled.text
