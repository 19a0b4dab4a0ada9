"""The audit log (SPEC §16): each change is one entry with who, what, the request's id
and address, and its changes; a refused change writes none; `GET /api/v1/audit` filters
and pages them for a SUPER_ADMINISTRATOR (every chain) and a workspace's admins (its
chain), and no route edits or deletes one."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.audit_models import AuditChain, AuditEntry

API = "/api/v1/workflow"
AUDIT = "/api/v1/audit"
SECRET_VALUE = "sk-live-0123456789abcd"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"llm_max_tokens": 10, "llm_retries": 0}


@pytest.fixture
async def root(users):
    return await users.make("root", "SUPER_ADMINISTRATOR")


def human(sid="h"):
    return {"id": sid, "agent": {"human": True}, "prompt": "Your name?", "depends_on": []}


async def entries(client, root, **filters) -> list[dict]:
    response = await client.get(AUDIT, headers=root["headers"], params=filters)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["message"] == "success" and set(body) == {"message", "entries", "next_cursor"}
    return body["entries"]


async def only(client, root, action: str, **filters) -> dict:
    found = await entries(client, root, action=action, **filters)
    assert len(found) == 1, found
    return found[0]


async def wait_status(client, who, trace_id, *statuses, timeout=15.0):
    for _ in range(int(timeout / 0.02)):
        body = (await client.get(f"{API}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in statuses:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"status stayed {body['status']}")


async def chain_ok(entries_oldest_first: list[dict]) -> None:
    """Each chain (one per workspace, one for the instance: SPEC §16) counts up by one."""
    chains: dict = {}
    for entry in entries_oldest_first:
        chains.setdefault(entry["workspace_id"], []).append(entry)
    for chain in chains.values():
        for before, after in zip(chain, chain[1:], strict=False):
            assert after["seq"] == before["seq"] + 1 and after["prev_hash"] == before["hash"]


async def test_template_family_and_the_request_that_made_it(client, root, alice):
    made = await client.post(f"{API}/template", headers={**alice["headers"], "X-Request-ID": "req-create-1"},
                             json={"name": "t", "steps": [human()], "description": "d"})
    assert made.status_code == 201, made.text
    tid = made.json()["template_id"]
    created = await only(client, root, "template.create")
    assert created["actor"] == {"user_id": alice["user_id"], "user_name": "alice", "via": "token"}
    assert created["target"] == {"type": "template", "id": tid, "name": "t"}
    assert created["request_id"] == "req-create-1" and created["client_ip"]
    # the template is in alice's personal workspace (SPEC §16): so is its entry
    assert created["workspace_id"] == made.json()["template"]["workspace_id"] is not None
    assert created["changes"]["name"] == {"from": None, "to": "t"}
    assert created["changes"]["version"] == {"from": None, "to": 1}
    put = await client.put(f"{API}/template/{tid}", headers=alice["headers"],
                           json={"name": "t2", "steps": [human(), human("h2")]})
    assert put.status_code == 200, put.text
    updated = await only(client, root, "template.update")
    assert updated["changes"]["name"] == {"from": "t", "to": "t2"}
    assert updated["changes"]["steps"] == {"from": ["h"], "to": ["h", "h2"]}
    assert updated["changes"]["description"] == {"from": "d", "to": ""}
    assert "shared" not in updated["changes"]
    restored = await client.post(f"{API}/template/{tid}/versions/1/restore", headers=alice["headers"])
    assert restored.status_code == 201, restored.text
    entry = await only(client, root, "template.restore")
    assert entry["changes"]["restored_from"] == {"from": None, "to": 1}
    assert entry["changes"]["version"] == {"from": 2, "to": 3}
    assert (await client.delete(f"{API}/template/{tid}", headers=alice["headers"])).status_code == 200
    deleted = await only(client, root, "template.delete")
    assert deleted["target"]["id"] == tid and deleted["changes"]["name"] == {"from": "t", "to": None}
    about = await entries(client, root, target_id=tid)
    assert [e["action"] for e in about] == ["template.delete", "template.restore", "template.update",
                                            "template.create"]
    await chain_ok(list(reversed(await entries(client, root))))


async def test_a_refused_change_writes_no_entry(client, root, alice):
    await client.post(f"{API}/template", headers=alice["headers"], json={"name": "t", "steps": [human()]})
    count = len(await entries(client, root))
    dup = await client.post(f"{API}/template", headers=alice["headers"], json={"name": "T", "steps": [human()]})
    assert dup.status_code == 409
    bad = await client.post(f"{API}/template", headers=alice["headers"], json={"name": "u", "steps": []})
    assert bad.status_code == 422
    secret = await client.post("/api/v1/resource/secret", headers=root["headers"],
                               json={"name": "1bad", "value": SECRET_VALUE, "hosts": ["x.example"]})
    assert secret.status_code == 422
    missing = await client.delete("/api/v1/auth/key/nope", headers=alice["headers"])
    assert missing.status_code == 404
    assert len(await entries(client, root)) == count


async def test_key_and_secret_entries_never_show_a_value(client, root, alice):
    made = await client.post("/api/v1/auth/key", headers=alice["headers"],
                             json={"name": "ci", "scopes": ["run:start"]})
    assert made.status_code == 201, made.text
    key_id, secret = made.json()["key_id"], made.json()["key"]
    created = await only(client, root, "key.create")
    assert created["target"] == {"type": "key", "id": key_id, "name": "ci"}
    assert created["changes"]["key"] == {"from": None, "to": "***"}
    assert created["changes"]["scopes"] == {"from": None, "to": ["run:start"]}
    assert (await client.delete(f"/api/v1/auth/key/{key_id}", headers=alice["headers"])).status_code == 200
    revoked = await only(client, root, "key.revoke")
    assert revoked["target"]["id"] == key_id and revoked["changes"]["revoked_at"]["from"] is None
    path = "/api/v1/resource/secret"
    assert (await client.post(path, headers=root["headers"],
                              json={"name": "CRM", "value": SECRET_VALUE, "hosts": ["crm.example"]})).status_code == 201
    assert (await client.put(f"{path}/CRM", headers=root["headers"],
                             json={"value": SECRET_VALUE + "x", "hosts": ["b.example"]})).status_code == 200
    assert (await client.delete(f"{path}/CRM", headers=root["headers"])).status_code == 200
    made_s, changed, gone = [await only(client, root, f"secret.{verb}") for verb in ("create", "update", "delete")]
    assert made_s["changes"] == {"value": {"from": None, "to": "***"}, "hosts": {"from": None, "to": ["crm.example"]}}
    assert changed["changes"] == {"value": {"from": "***", "to": "***"},
                                  "hosts": {"from": ["crm.example"], "to": ["b.example"]}}
    assert gone["changes"]["value"] == {"from": "***", "to": None}
    assert gone["target"]["name"] == "CRM"
    listed = (await client.get(AUDIT, headers=root["headers"])).text
    assert SECRET_VALUE not in listed and secret not in listed
    stored = " ".join(str(row.changes) for row in await client.app.ctx.core.db.list(AuditEntry.select()))
    assert SECRET_VALUE not in stored and secret not in stored


async def test_run_family(client, root, alice):
    tid = (await client.post(f"{API}/template", headers=alice["headers"],
                             json={"name": "t", "steps": [human()]})).json()["template_id"]
    key = (await client.post("/api/v1/auth/key", headers=alice["headers"],
                             json={"name": "ci", "scopes": ["run:start", "run:read"]})).json()
    started = await client.post(f"{API}/run", headers={"Authorization": f"Bearer {key['key']}"},
                                json={"template_id": tid, "input": "x"})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    start = await only(client, root, "run.start")
    assert start["actor"] == {"user_id": alice["user_id"], "user_name": "alice", "via": "key",
                              "key_id": key["key_id"]}
    assert start["target"] == {"type": "run", "id": trace_id, "name": "t"}
    assert start["changes"]["status"] == {"from": None, "to": "queued"}
    waiting = await wait_status(client, alice, trace_id, "waiting_reply")
    request_id = waiting["pending_replies"][0]["request_id"]
    stale = await client.post(f"/api/v1/workflow/reply/{trace_id}", headers=alice["headers"],
                              json={"content": "x", "request_id": "old"})
    assert stale.status_code == 409
    assert await entries(client, root, action="run.reply") == []  # refused: none
    replied = await client.post(f"/api/v1/workflow/reply/{trace_id}", headers=alice["headers"],
                                json={"content": "Ann"})
    assert replied.status_code == 200, replied.text
    reply = await only(client, root, "run.reply")
    assert reply["changes"] == {"reply": {"from": None, "to": {"request_id": request_id, "step_id": "h"}}}
    await wait_status(client, alice, trace_id, "succeeded")
    second = (await client.post(f"{API}/run", headers=alice["headers"], json={"template_id": tid})).json()["trace_id"]
    await wait_status(client, alice, second, "waiting_reply")
    cancelled = await client.post(f"/api/v1/workflow/cancel/{second}", headers=alice["headers"])
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    cancel = await only(client, root, "run.cancel")
    assert cancel["target"]["id"] == second and cancel["changes"] == {"cancel_requested": {"from": False, "to": True}}
    assert (await client.post(f"/api/v1/workflow/cancel/{second}", headers=alice["headers"])).status_code == 409
    assert len(await entries(client, root, action="run.cancel")) == 1
    retried = await client.post(f"{API}/run/{second}/retry", headers=alice["headers"])
    assert retried.status_code == 202, retried.text
    retry = await only(client, root, "run.retry")
    assert retry["target"]["id"] == retried.json()["trace_id"]
    assert retry["changes"]["retry_of"] == {"from": None, "to": second}
    forked = await client.post(f"{API}/run/{trace_id}/fork", headers=alice["headers"], json={})
    assert forked.status_code == 202, forked.text
    fork = await only(client, root, "run.fork")
    assert fork["target"]["id"] == forked.json()["trace_id"]
    assert fork["changes"]["forked_from"] == {"from": None, "to": trace_id}
    by_alice = await entries(client, root, actor="alice", action="run.start")
    assert len(by_alice) == 2 and by_alice == await entries(client, root, actor=alice["user_id"], action="run.start")


async def test_top_up(client, root, alice, priced):
    steps = [{"id": f"s{i}", "agent": {"worker": priced["worker"]}, "prompt": "Say {{input}} fake:cached=2",
              "depends_on": [f"s{i - 1}"] if i else []} for i in range(3)]
    tid = (await client.post(f"{API}/template", headers=alice["headers"], json={
        "name": "t", "steps": steps, "limits": {"budget_usd": 0.125, "on_budget": "pause"}})).json()["template_id"]
    trace_id = (await client.post(f"{API}/run", headers=alice["headers"],
                                  json={"template_id": tid, "input": "hi"})).json()["trace_id"]
    assert (await wait_status(client, alice, trace_id, "waiting_budget", "failed", "succeeded"))["status"] == \
        "waiting_budget"
    raised = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": "1"})
    assert raised.status_code == 200, raised.text
    top = await only(client, root, "run.top_up")
    assert top["target"]["id"] == trace_id
    assert top["changes"]["budget_usd"] == {"from": "0.125", "to": "1.125"}
    await wait_status(client, alice, trace_id, "succeeded", "failed")
    again = await client.post(f"{API}/run/{trace_id}/budget", headers=alice["headers"], json={"add_usd": 1})
    assert again.status_code == 409
    assert len(await entries(client, root, action="run.top_up")) == 1


async def test_instance_level_auth_entries_and_unchanged_auth_answers(client, root, users):
    bob = await users.make("bob")
    login = await only(client, root, "auth.login", actor="bob")
    assert login["target"] == {"type": "user", "id": bob["user_id"], "name": "bob"}
    assert login["workspace_id"] is None
    wrong = await client.post("/api/v1/auth/login", json={"user_name": "bob", "password": "wrong-password-1"})
    assert wrong.status_code == 401 and wrong.json()["error"] == "InvalidCredentialsError"
    nobody = await client.post("/api/v1/auth/login", json={"user_name": "nobody", "password": "wrong-password-1"})
    assert nobody.status_code == 404 and nobody.json()["error"] == "UserNotExistError"
    failed = await entries(client, root, action="auth.login_failed")
    assert [(e["target"]["name"], e["changes"]["reason"]["to"]) for e in failed] == [
        ("nobody", "no such user"), ("bob", "wrong password")]
    changed = await client.put("/api/v1/auth/authority", headers=root["headers"],
                               json={"user_id": bob["user_id"], "new_authority": "ADMINISTRATOR"})
    assert changed.json() == {"message": "success", "user_id": bob["user_id"], "new_authority": "ADMINISTRATOR"}
    authority = await only(client, root, "user.authority")
    assert authority["actor"]["user_name"] == "root"
    assert authority["changes"] == {"role": {"from": "USER", "to": "ADMINISTRATOR"}}
    gone = await client.delete(f"/api/v1/auth/{bob['user_id']}", headers=root["headers"])
    assert gone.json() == {"message": "success"}
    deleted = await only(client, root, "user.delete")
    assert deleted["target"] == {"type": "user", "id": bob["user_id"], "name": "bob"}
    await chain_ok(list(reversed(await entries(client, root))))
    head = await AuditChain.aget(AuditChain.chain == "")
    newest = (await entries(client, root, limit=1))[0]
    assert head.seq == newest["seq"] and head.hash == newest["hash"]


async def test_reading_the_log(client, root, alice):
    for name in ("a", "b", "c"):
        await client.post(f"{API}/template", headers=alice["headers"], json={"name": name, "steps": [human()]})
    # a user reads the chains of the workspaces they own or administer (their personal
    # one), never instance-level entries (their login) nor another's workspace
    mine = await client.get(AUDIT, headers=alice["headers"])
    assert mine.status_code == 200, mine.text
    assert [e["target"]["name"] for e in mine.json()["entries"]] == ["c", "b", "a"]
    assert {e["action"] for e in mine.json()["entries"]} == {"template.create"}
    [root_personal] = (await client.get("/api/v1/workspace", headers=root["headers"])).json()["workspaces"]
    refused = await client.get(AUDIT, headers=alice["headers"], params={"workspace_id": root_personal["workspace_id"]})
    assert refused.status_code == 404 and refused.json()["error"] == "NotFoundError"
    first = await client.get(AUDIT, headers=root["headers"], params={"action": "template.create", "limit": 2})
    body = first.json()
    assert [e["target"]["name"] for e in body["entries"]] == ["c", "b"] and body["next_cursor"]
    rest = (await client.get(AUDIT, headers=root["headers"],
                             params={"action": "template.create", "cursor": body["next_cursor"]})).json()
    assert [e["target"]["name"] for e in rest["entries"]] == ["a"] and rest["next_cursor"] is None
    at = body["entries"][0]["at"]
    assert await entries(client, root, action="template.create", **{"from": at}) == body["entries"][:1]
    assert len(await entries(client, root, action="template.create", to=at)) == 2
    assert len(await entries(client, root, action="template.create", **{"from": at[:10]})) == 3
    assert await entries(client, root, actor="\x00", action="nope") == []
    for params in ({"limit": 0}, {"limit": 1001}, {"from": "yesterday"}, {"to": "2026-13-01"},
                   {"cursor": "run.1.x"}, {"from": "9999-12-31T23:59:59-23:59"}, {"from": ""}):
        response = await client.get(AUDIT, headers=root["headers"], params=params)
        assert response.status_code == 422, (params, response.text)
    entry_id = body["entries"][0]["audit_id"]
    for method in ("put", "patch", "delete"):
        for path in (AUDIT, f"{AUDIT}/{entry_id}"):
            response = await client.request(method, path, headers=root["headers"])
            assert response.status_code in (404, 405), (method, path, response.status_code)
    assert len(await entries(client, root, action="template.create")) == 3


async def test_hooks_and_schedules_start_runs_for_their_owner(client, root, alice):
    import datetime as dt
    import time

    from standardwebhooks import Webhook

    from orchestra.db.trigger_models import WorkflowSchedule
    from orchestra.services.schedule_fires import FireLoop

    tid = (await client.post(f"{API}/template", headers=alice["headers"],
                             json={"name": "t", "steps": [human()]})).json()["template_id"]
    hook = (await client.post(f"{API}/hook", headers=alice["headers"], json={"template_id": tid})).json()
    body = '{"a":1}'
    when = dt.datetime.fromtimestamp(time.time(), dt.UTC)
    headers = {"webhook-id": "msg_audit_1", "webhook-timestamp": str(int(when.timestamp())),
               "webhook-signature": Webhook(hook["secret"]).sign("msg_audit_1", when, body),
               "content-type": "application/json"}
    called = await client.post(f"/api/v1/hooks/{hook['hook_id']}", content=body, headers=headers)
    assert called.status_code == 202, called.text
    by_hook = await only(client, root, "run.start")
    assert by_hook["actor"] == {"user_id": alice["user_id"], "user_name": "alice", "via": "hook"}
    assert by_hook["target"]["id"] == called.json()["trace_id"]
    assert by_hook["changes"]["trigger"]["to"]["hook_id"] == hook["hook_id"]
    made = await client.post(f"{API}/schedule", headers=alice["headers"],
                             json={"template_id": tid, "cron": "* * * * *"})
    assert made.status_code == 201, made.text
    row = await WorkflowSchedule.aget(WorkflowSchedule.id == made.json()["schedule_id"])
    await FireLoop(client.app.ctx.core).fire_due(now=row.next_due_at + dt.timedelta(seconds=5))
    starts = await entries(client, root, action="run.start")
    assert len(starts) == 2, starts
    fired = starts[0]
    assert fired["actor"] == {"user_id": alice["user_id"], "user_name": "alice", "via": "schedule"}
    assert fired["changes"]["trigger"]["to"]["schedule_id"] == made.json()["schedule_id"]
    await chain_ok(list(reversed(await entries(client, root))))
