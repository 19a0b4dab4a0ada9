"""Inbound webhooks (SPEC §11) in process, on SQLite and PostgreSQL: management, the
Standard Webhooks check (401 and nothing written), once per webhook-id, the input
expression, the body bound (exactly 1 MiB accepted, more 413) and the per-hook limit."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from standardwebhooks import Webhook

from orchestra.db.access_models import RunStartKey, WebhookHook
from orchestra.db.models import WorkflowRun

WF = "/api/v1/workflow"
HOOKS = "/api/v1/workflow/hook"


@pytest.fixture
def database_url(both_stores):
    return both_stores


async def template(client, who, name="t", **extra) -> str:
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "About {{input}}?"}]
    response = await client.post(f"{WF}/template", headers=who["headers"],
                                 json={"name": name, "steps": steps, **extra})
    assert response.status_code == 201, response.text
    return response.json()["template_id"]


async def make_hook(client, who, tid, **extra) -> dict:
    response = await client.post(HOOKS, headers=who["headers"], json={"template_id": tid, **extra})
    assert response.status_code == 201, response.text
    return response.json()


def signed(secret: str, body: bytes, *, msg_id: str | None = None, at: float | None = None) -> dict:
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    when = dt.datetime.fromtimestamp(at if at is not None else time.time(), dt.UTC)
    signature = Webhook(secret).sign(msg_id, when, body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": signature, "content-type": "application/json"}


def path(hook: dict) -> str:
    return "/api/v1/hooks/" + hook["hook_id"]


async def count(client, model) -> int:
    return await client.app.ctx.core.db.count(model.select())


async def test_create_list_show_delete(client, alice):
    tid = await template(client, alice)
    made = await make_hook(client, alice, tid)
    assert made["secret"].startswith("whsec_") and made["url"].endswith(path(made))
    hook = made["hook"]
    assert hook["template_id"] == tid and hook["input"] == "body" and "secret" not in hook
    row = await WebhookHook.aget(WebhookHook.id == made["hook_id"])
    assert made["secret"] not in row.secret_encrypted
    listed = (await client.get(HOOKS, headers=alice["headers"])).json()["hooks"]
    assert listed == [hook]
    shown = await client.get(f"{HOOKS}/{made['hook_id']}", headers=alice["headers"])
    assert shown.status_code == 200 and shown.json()["hook"] == hook
    assert (await client.delete(f"{HOOKS}/{made['hook_id']}", headers=alice["headers"])).status_code == 200
    assert (await client.get(f"{HOOKS}/{made['hook_id']}", headers=alice["headers"])).status_code == 404
    body = b'{"a":1}'
    gone = await client.post(path(made), content=body, headers=signed(made["secret"], body))
    assert gone.status_code == 404


async def test_bad_hooks_are_422(client, alice, users):
    bob = await users.make("bob")
    private = await template(client, bob, "private")
    for body, field in (({"template_id": private}, "template_id"),
                        ({"template_id": str(uuid.uuid4())}, "template_id"),
                        ({"template_id": await template(client, alice), "input": "input.x"}, "input"),
                        ({"template_id": await template(client, alice, "t2"), "input": "body."}, "input")):
        answer = await client.post(HOOKS, headers=alice["headers"], json=body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["field"] == field
    assert await count(client, WebhookHook) == 0


async def test_a_signed_call_starts_one_run_per_webhook_id(client, alice):
    tid = await template(client, alice)
    made = await make_hook(client, alice, tid)
    body = b'{"order": 7}'
    headers = signed(made["secret"], body, msg_id="msg_1")
    first = await client.post(path(made), content=body, headers=headers)
    assert first.status_code == 202, first.text
    trace = first.json()["trace_id"]
    again = await client.post(path(made), content=body, headers=headers)
    assert again.status_code == 200 and again.json()["trace_id"] == trace
    assert await count(client, WorkflowRun) == 1
    run = (await client.get(f"{WF}/run/{trace}", headers=alice["headers"])).json()
    assert run["trigger"] == {"kind": "webhook", "hook_id": made["hook_id"], "webhook_id": "msg_1"}
    assert run["input"] == '{"order":7}' and run["owner_id"] == alice["user_id"]


async def test_bad_missing_and_stale_signatures_are_401_and_write_nothing(client, alice):
    made = await make_hook(client, alice, await template(client, alice))
    body = b'{"a":1}'
    other = "whsec_" + "QUJD" * 8
    cases = [
        {"content-type": "application/json"},  # nothing
        signed(other, body),  # another secret
        signed(made["secret"], b'{"a":2}'),  # another body
        # 5 minutes is the tolerance; 30 s more, as the cases are signed before any is sent
        # (a call signed 301 s ahead is within it again a second or two later)
        signed(made["secret"], body, at=time.time() - 330),  # stale
        signed(made["secret"], body, at=time.time() + 330),  # from the future
        {**signed(made["secret"], body), "webhook-signature": "v1,!!!"},
        {**signed(made["secret"], body), "webhook-signature": "garbage"},
        {**signed(made["secret"], body), "webhook-timestamp": "nan"},
    ]
    for headers in cases:
        answer = await client.post(path(made), content=body, headers=headers)
        assert answer.status_code == 401, (headers, answer.text)
        assert answer.json()["error"] in ("AuthenticationRequiredError", "TokenInvalidError")
    assert await count(client, WorkflowRun) == 0 and await count(client, RunStartKey) == 0
    ok = await client.post(path(made), content=body, headers=signed(made["secret"], body))
    assert ok.status_code == 202


async def test_the_input_expression_and_refused_calls_are_not_remembered(client, alice):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tid = await template(client, alice, input_schema=schema)
    made = await make_hook(client, alice, tid, input='{"n": int(query.n) + size(headers["x-extra"])}')
    body = b"plain text"
    headers = {**signed(made["secret"], body, msg_id="m"), "content-type": "text/plain", "x-extra": "abc"}
    answer = await client.post(path(made) + "?n=4&n=9", content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    run = (await client.get(f"{WF}/run/{answer.json()['trace_id']}", headers=alice["headers"])).json()
    assert run["input"] == {"n": 7}
    # an expression failure is 422, and its webhook-id is not remembered
    failing = {**signed(made["secret"], body, msg_id="m2"), "content-type": "text/plain"}
    refused = await client.post(path(made) + "?n=4", content=body, headers=failing)
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "input"
    assert await count(client, RunStartKey) == 1
    fixed = {**failing, "x-extra": ""}
    assert (await client.post(path(made) + "?n=4", content=body, headers=fixed)).status_code == 202


async def test_exactly_one_mib_is_accepted_and_more_is_413(client, alice):
    made = await make_hook(client, alice, await template(client, alice))
    body = b'"' + b"x" * (1024 * 1024 - 2) + b'"'
    assert len(body) == 1024 * 1024
    answer = await client.post(path(made), content=body, headers=signed(made["secret"], body))
    assert answer.status_code == 202, answer.text[:300]
    bigger = body[:-1] + b'x"'
    answer = await client.post(path(made), content=bigger, headers=signed(made["secret"], bigger))
    assert answer.status_code == 413 and answer.json()["error"] == "PayloadTooLargeError"
    assert await count(client, WorkflowRun) == 1


@pytest.fixture
def settings_overrides():
    return {"rate_limit_hook": "20/minute"}  # more than any other test here sends to one hook


async def test_a_flood_on_one_hook_is_429_for_that_hook_only(client, alice):
    tid = await template(client, alice)
    flooded, quiet = await make_hook(client, alice, tid), await make_hook(client, alice, tid)
    body = b"{}"
    codes = [(await client.post(path(flooded), content=body, headers=signed(flooded["secret"], body))).status_code
             for _ in range(22)]
    assert codes == [202] * 20 + [429] * 2
    refused = await client.post(path(flooded), content=body, headers=signed(flooded["secret"], body))
    assert refused.json()["error"] == "RateLimitedError" and int(refused.headers["retry-after"]) >= 1
    other = await client.post(path(quiet), content=body, headers=signed(quiet["secret"], body))
    assert other.status_code == 202


async def test_keys_cannot_manage_hooks(client, alice):
    made = await client.post("/api/v1/auth/key", headers=alice["headers"],
                             json={"name": "k", "scopes": ["run:start", "template:write"]})
    key = {"Authorization": f"Bearer {made.json()['key']}"}
    answer = await client.post(HOOKS, headers=key, json={"template_id": await template(client, alice)})
    assert answer.status_code == 403 and answer.json()["error"] == "PermissionDeniedError"


async def test_a_webhook_id_older_than_24_hours_starts_a_new_run(client, alice):
    from orchestra.db.models import utcnow

    made = await make_hook(client, alice, await template(client, alice))
    body = b"{}"
    first = await client.post(path(made), content=body, headers=signed(made["secret"], body, msg_id="old"))
    assert first.status_code == 202
    core = client.app.ctx.core
    await core.db.aexecute(RunStartKey.update(created_at=utcnow() - dt.timedelta(hours=25)))
    again = await client.post(path(made), content=body, headers=signed(made["secret"], body, msg_id="old"))
    assert again.status_code == 202 and again.json()["trace_id"] != first.json()["trace_id"]
    assert await count(client, WorkflowRun) == 2 and await count(client, RunStartKey) == 1
