"""The audit log covers every resource (SPEC §16): workers, schedules, hooks and
subscriptions in their workspace's chain; providers, skills, MCP servers and system nodes
made by administrators in the instance chain; a user's uploaded files in their personal
workspace's chain. Through the real routes, on both stores:
each create, update and delete is exactly one entry naming its action, target, actor and
changes (secret values and keys as "***"), a refused change writes none, and the chains
still verify store-side (`orchestra audit verify`'s function)."""

from __future__ import annotations

import asyncio
import json

import pytest

from orchestra.db.audit_models import AuditEntry
from orchestra.services import audit_chain
from tests.conftest import LOOPBACK_STEPS

API = "/api/v1/workflow"
AUDIT = "/api/v1/audit"
PROVIDER = "/api/v1/provider"
WORKER = "/api/v1/agent/worker"
SKILL = "/api/v1/resource/skill"
MCP = "/api/v1/resource/mcp"
PROVIDER_KEY = "sk-provider-key-0123456789"
HEADER_SECRET = "Bearer sk-very-secret-header-9876"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {**LOOPBACK_STEPS, "upload_quota_bytes": 4096}


@pytest.fixture
async def root(users):
    return await users.make("root", "SUPER_ADMINISTRATOR")


async def entries(client, root, **filters) -> list[dict]:
    response = await client.get(AUDIT, headers=root["headers"], params={"limit": 1000, **filters})
    assert response.status_code == 200, response.text
    return response.json()["entries"]


async def only(client, root, action: str) -> dict:
    found = await entries(client, root, action=action)
    assert len(found) == 1, found
    return found[0]


def actor_of(who: dict) -> dict:
    return {"user_id": who["user_id"], "user_name": who["user_name"], "via": "token"}


async def personal_workspace(client, who) -> str:
    [workspace] = (await client.get("/api/v1/workspace", headers=who["headers"])).json()["workspaces"]
    return workspace["workspace_id"]


async def verified(client) -> None:
    verdict = await audit_chain.verify(client.app.ctx.core)
    assert verdict.intact, verdict.problems
    assert verdict.entries == len(await client.app.ctx.core.db.list(AuditEntry.select()))


async def stored_text(client) -> str:
    rows = await client.app.ctx.core.db.list(AuditEntry.select())
    return json.dumps([[row.changes, row.target] for row in rows])


async def unchanged_count(client, root, count: int) -> None:
    assert len(await entries(client, root)) == count


async def make_provider(client, admin, fake_llm, **extra) -> dict:
    made = await client.post(PROVIDER, headers=admin["headers"], json={
        "name": "fake", "provider": "openai_compatible", "model_id": "fake-model",
        "base_url": fake_llm.base_url, **extra})
    assert made.status_code == 201, made.text
    return made.json()


async def test_workers(client, root, admin, alice, fake_llm):
    provider = await make_provider(client, admin, fake_llm)
    made = await client.post(WORKER, headers=alice["headers"], json={
        "name": "w", "provider_id": provider["provider_id"], "system_prompt": "Be brief.", "tools": ["calculator"]})
    assert made.status_code == 201, made.text
    wid = made.json()["worker_id"]
    created = await only(client, root, "worker.create")
    assert created["actor"] == actor_of(alice)
    assert created["target"] == {"type": "worker", "id": wid, "name": "w"}
    assert created["workspace_id"] == made.json()["workspace_id"] == await personal_workspace(client, alice)
    assert created["changes"]["name"] == {"from": None, "to": "w"}
    assert created["changes"]["provider_id"] == {"from": None, "to": provider["provider_id"]}
    assert created["changes"]["tools"] == {"from": None, "to": ["calculator"]}
    assert created["changes"]["system_prompt"] == {"from": None, "to": "Be brief."}
    count = len(await entries(client, root))
    refused = [
        await client.put(f"{WORKER}/{wid}", headers=alice["headers"], json={"provider_id": "nope"}),
        await client.put(f"{WORKER}/{wid}", headers=alice["headers"], json={"tools": ["no-such-tool"]}),
        await client.post(WORKER, headers=alice["headers"], json={"name": "W", "provider_id": provider["provider_id"]}),
        await client.delete(f"{WORKER}/nope", headers=alice["headers"]),
    ]
    assert [r.status_code for r in refused] == [422, 422, 409, 404]
    await unchanged_count(client, root, count)
    changed = await client.put(f"{WORKER}/{wid}", headers=alice["headers"], json={"name": "w2", "model": "m2"})
    assert changed.status_code == 200, changed.text
    updated = await only(client, root, "worker.update")
    assert updated["actor"] == actor_of(alice) and updated["target"] == {"type": "worker", "id": wid, "name": "w2"}
    assert updated["changes"] == {"name": {"from": "w", "to": "w2"}, "model": {"from": None, "to": "m2"}}
    assert (await client.delete(f"{WORKER}/{wid}", headers=alice["headers"])).status_code == 200
    deleted = await only(client, root, "worker.delete")
    assert deleted["target"] == {"type": "worker", "id": wid, "name": "w2"}
    assert deleted["changes"]["name"] == {"from": "w2", "to": None}
    assert deleted["workspace_id"] == created["workspace_id"]
    # the worker's entries are its workspace's: alice (its owner) reads them
    mine = (await client.get(AUDIT, headers=alice["headers"], params={"target_id": wid})).json()["entries"]
    assert [e["action"] for e in mine] == ["worker.delete", "worker.update", "worker.create"]
    await verified(client)


async def test_providers_never_show_their_key(client, root, admin, fake_llm):
    count = len(await entries(client, root))
    bad = await client.post(PROVIDER, headers=admin["headers"], json={
        "name": "x", "provider": "openai_compatible", "model_id": "m", "base_url": "ftp://nowhere"})
    assert bad.status_code == 422
    await unchanged_count(client, root, count)
    provider = await make_provider(client, admin, fake_llm, api_key=PROVIDER_KEY)
    pid = provider["provider_id"]
    created = await only(client, root, "provider.create")
    assert created["workspace_id"] is None and created["actor"] == actor_of(admin)
    assert created["target"] == {"type": "provider", "id": pid, "name": "fake"}
    assert created["changes"]["api_key"] == {"from": None, "to": "***"}
    assert created["changes"]["model_id"] == {"from": None, "to": "fake-model"}
    # the masked key sent back keeps the key: no api_key change
    kept = await client.put(f"{PROVIDER}/{pid}", headers=admin["headers"],
                            json={"name": "fake2", "api_key": provider["api_key"]})
    assert kept.status_code == 200, kept.text
    assert (await only(client, root, "provider.update"))["changes"] == {"name": {"from": "fake", "to": "fake2"}}
    rekeyed = await client.put(f"{PROVIDER}/{pid}", headers=admin["headers"],
                               json={"api_key": PROVIDER_KEY + "x", "limits": {"max_concurrency": 2}})
    assert rekeyed.status_code == 200, rekeyed.text
    newest = (await entries(client, root, action="provider.update"))[0]
    assert newest["changes"] == {"api_key": {"from": "***", "to": "***"},
                                 "limits": {"from": None, "to": {"max_concurrency": 2}}}
    count = len(await entries(client, root))
    refused = await client.put(f"{PROVIDER}/{pid}", headers=admin["headers"], json={"limits": {"max_concurrency": 0}})
    assert refused.status_code == 422
    await unchanged_count(client, root, count)
    assert (await client.delete(f"{PROVIDER}/{pid}", headers=admin["headers"])).status_code == 200
    deleted = await only(client, root, "provider.delete")
    assert deleted["target"] == {"type": "provider", "id": pid, "name": "fake2"}
    assert deleted["changes"]["api_key"] == {"from": "***", "to": None}
    assert PROVIDER_KEY not in await stored_text(client)
    await verified(client)


async def test_skills_and_system_nodes(client, root, admin, alice, fake_llm):
    made = await client.post(SKILL, headers=admin["headers"], json={"name": "s", "instructions": "Do it."})
    assert made.status_code == 201, made.text
    sid = made.json()["skill_id"]
    created = await only(client, root, "skill.create")
    assert created["workspace_id"] is None and created["actor"] == actor_of(admin)
    assert created["target"] == {"type": "skill", "id": sid, "name": "s"}
    assert created["changes"]["instructions"] == {"from": None, "to": "Do it."}
    count = len(await entries(client, root))
    assert (await client.post(SKILL, headers=admin["headers"], json={"name": "S"})).status_code == 409
    assert (await client.post(SKILL, headers=alice["headers"], json={"name": "t"})).status_code == 403
    assert (await client.put(f"{SKILL}/{sid}", headers=admin["headers"], json={"name": ""})).status_code == 422
    await unchanged_count(client, root, count)
    changed = await client.put(f"{SKILL}/{sid}", headers=admin["headers"], json={"description": "d"})
    assert changed.status_code == 200, changed.text
    assert (await only(client, root, "skill.update"))["changes"] == {"description": {"from": "", "to": "d"}}
    assert (await client.delete(f"{SKILL}/{sid}", headers=admin["headers"])).status_code == 200
    deleted = await only(client, root, "skill.delete")
    assert deleted["target"]["id"] == sid and deleted["changes"]["name"] == {"from": "s", "to": None}
    provider = await make_provider(client, admin, fake_llm)
    node = await client.put("/api/v1/agent/node/planner", headers=admin["headers"],
                            json={"provider": provider["provider_id"], "model": "m"})
    assert node.status_code == 200, node.text
    entry = await only(client, root, "node.update")
    assert entry["target"] == {"type": "node", "id": "planner", "name": "planner"}
    assert entry["workspace_id"] is None
    assert entry["changes"] == {"provider": {"from": None, "to": provider["provider_id"]},
                                "model": {"from": None, "to": "m"}}
    bad = await client.put("/api/v1/agent/node/planner", headers=admin["headers"], json={"provider": "nope"})
    assert bad.status_code == 422
    assert len(await entries(client, root, action="node.update")) == 1
    await verified(client)


async def test_mcp_servers_never_show_header_values(client, root, admin, fake_mcp):
    count = len(await entries(client, root))
    bad = await client.post(MCP, headers=admin["headers"], json={"name": "bad name", "transport": "streamable_http",
                                                                 "url": fake_mcp.url})
    assert bad.status_code == 422
    await unchanged_count(client, root, count)
    body = {"name": "fake", "transport": "streamable_http", "url": fake_mcp.url,
            "headers": {"Authorization": HEADER_SECRET}}
    made = await client.post(MCP, headers=admin["headers"], json=body)
    assert made.status_code == 201, made.text
    server_id, server = made.json()["server_id"], made.json()["server"]
    created = await only(client, root, "mcp_server.create")
    assert created["workspace_id"] is None and created["actor"] == actor_of(admin)
    assert created["target"] == {"type": "mcp_server", "id": server_id, "name": "fake"}
    assert created["changes"]["headers"] == {"from": None, "to": {"Authorization": "***"}}
    assert created["changes"]["url"] == {"from": None, "to": fake_mcp.url}
    # the hint sent back keeps the header: only the timeout changed
    kept = await client.put(f"{MCP}/{server_id}", headers=admin["headers"],
                            json={**body, "headers": server["headers"], "timeout_seconds": 12})
    assert kept.status_code == 200, kept.text
    assert (await only(client, root, "mcp_server.update"))["changes"] == {
        "timeout_seconds": {"from": 30.0, "to": 12.0}}
    moved = await client.put(f"{MCP}/{server_id}", headers=admin["headers"],
                             json={**body, "name": "fake2", "headers": {"Authorization": HEADER_SECRET + "0"}})
    assert moved.status_code == 200, moved.text
    newest = (await entries(client, root, action="mcp_server.update"))[0]
    assert newest["changes"] == {"name": {"from": "fake", "to": "fake2"},
                                 "timeout_seconds": {"from": 12.0, "to": 30.0},
                                 "headers": {"from": {"Authorization": "***"}, "to": {"Authorization": "***"}}}
    assert (await client.delete(f"{MCP}/{server_id}", headers=admin["headers"])).status_code == 200
    deleted = await only(client, root, "mcp_server.delete")
    assert deleted["target"] == {"type": "mcp_server", "id": server_id, "name": "fake2"}
    assert deleted["changes"]["headers"] == {"from": {"Authorization": "***"}, "to": None}
    assert "very-secret" not in await stored_text(client)
    await verified(client)


async def make_template(client, who, name="t") -> str:
    made = await client.post(f"{API}/template", headers=who["headers"], json={
        "name": name, "steps": [{"id": "h", "agent": {"human": True}, "prompt": "Name?", "depends_on": []}]})
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


async def test_schedules(client, root, alice):
    tid = await make_template(client, alice)
    workspace = await personal_workspace(client, alice)
    count = len(await entries(client, root))
    bad = await client.post(f"{API}/schedule", headers=alice["headers"],
                            json={"template_id": tid, "cron": "0 0 30 2 *"})
    assert bad.status_code == 422
    await unchanged_count(client, root, count)
    made = await client.post(f"{API}/schedule", headers=alice["headers"],
                             json={"template_id": tid, "cron": "*/5 * * * *", "input": "x"})
    assert made.status_code == 201, made.text
    sid = made.json()["schedule_id"]
    created = await only(client, root, "schedule.create")
    assert created["actor"] == actor_of(alice) and created["workspace_id"] == workspace
    assert created["target"] == {"type": "schedule", "id": sid, "name": "t"}
    assert created["changes"]["cron"] == {"from": None, "to": "*/5 * * * *"}
    assert created["changes"]["template_id"] == {"from": None, "to": tid}
    assert created["changes"]["enabled"] == {"from": None, "to": True}
    # pausing is an update of `enabled`
    body = {"template_id": tid, "cron": "*/5 * * * *", "input": "x", "enabled": False}
    paused = await client.put(f"{API}/schedule/{sid}", headers=alice["headers"], json=body)
    assert paused.status_code == 200, paused.text
    assert (await only(client, root, "schedule.update"))["changes"] == {"enabled": {"from": True, "to": False}}
    count = len(await entries(client, root))
    refused = await client.put(f"{API}/schedule/{sid}", headers=alice["headers"], json={**body, "timezone": "Mars/Base"})
    assert refused.status_code == 422
    await unchanged_count(client, root, count)
    assert (await client.delete(f"{API}/schedule/{sid}", headers=alice["headers"])).status_code == 200
    deleted = await only(client, root, "schedule.delete")
    assert deleted["target"]["id"] == sid and deleted["changes"]["cron"] == {"from": "*/5 * * * *", "to": None}
    assert (await client.delete(f"{API}/schedule/{sid}", headers=alice["headers"])).status_code == 404
    assert len(await entries(client, root, action="schedule.delete")) == 1
    await verified(client)


async def test_hooks_and_subscriptions_never_show_their_secret(client, root, alice):
    tid = await make_template(client, alice)
    workspace = await personal_workspace(client, alice)
    count = len(await entries(client, root))
    bad = await client.post(f"{API}/hook", headers=alice["headers"], json={"template_id": tid, "input": "body +"})
    assert bad.status_code == 422
    bad = await client.post(f"{API}/subscription", headers=alice["headers"],
                            json={"url": "ftp://x", "events": ["run.failed"]})
    assert bad.status_code == 422
    await unchanged_count(client, root, count)
    hook = await client.post(f"{API}/hook", headers=alice["headers"], json={"template_id": tid})
    assert hook.status_code == 201, hook.text
    hook_id, hook_secret = hook.json()["hook_id"], hook.json()["secret"]
    created = await only(client, root, "hook.create")
    assert created["actor"] == actor_of(alice) and created["workspace_id"] == workspace
    assert created["target"] == {"type": "hook", "id": hook_id, "name": "t"}
    assert created["changes"] == {"template_id": {"from": None, "to": tid}, "input": {"from": None, "to": "body"},
                                  "secret": {"from": None, "to": "***"}}
    assert (await client.delete(f"{API}/hook/{hook_id}", headers=alice["headers"])).status_code == 200
    deleted = await only(client, root, "hook.delete")
    assert deleted["target"]["id"] == hook_id and deleted["changes"]["secret"] == {"from": "***", "to": None}
    url = "http://127.0.0.1:9/receive"
    made = await client.post(f"{API}/subscription", headers=alice["headers"],
                             json={"url": url, "events": ["run.failed", "run.succeeded"], "template_id": tid})
    assert made.status_code == 201, made.text
    sub_id, sub_secret = made.json()["subscription_id"], made.json()["secret"]
    created = await only(client, root, "subscription.create")
    assert created["actor"] == actor_of(alice) and created["workspace_id"] == workspace
    assert created["target"] == {"type": "subscription", "id": sub_id, "name": url}
    assert created["changes"] == {"url": {"from": None, "to": url},
                                  "events": {"from": None, "to": ["run.failed", "run.succeeded"]},
                                  "template_id": {"from": None, "to": tid}, "secret": {"from": None, "to": "***"}}
    assert (await client.delete(f"{API}/subscription/{sub_id}", headers=alice["headers"])).status_code == 200
    deleted = await only(client, root, "subscription.delete")
    assert deleted["target"]["id"] == sub_id and deleted["changes"]["url"] == {"from": url, "to": None}
    assert (await client.delete(f"{API}/subscription/{sub_id}", headers=alice["headers"])).status_code == 404
    assert len(await entries(client, root, action="subscription.delete")) == 1
    text = await stored_text(client)
    assert hook_secret not in text and sub_secret not in text
    await verified(client)


async def deliveries_of(client, subscription_id: str) -> list:
    from orchestra.db.trigger_models import WebhookDelivery

    return await client.app.ctx.core.db.list(WebhookDelivery.select().where(
        WebhookDelivery.subscription == subscription_id).order_by(WebhookDelivery.created_at, WebhookDelivery.id))


async def test_audit_entries_are_events_of_the_workspace_subscriptions(client, root, alice, admin, fake_llm):
    from standardwebhooks import Webhook

    from tests.fakes.webhook_receiver import WebhookReceiver

    with WebhookReceiver() as receiver:
        made = await client.post(f"{API}/subscription", headers=alice["headers"],
                                 json={"url": receiver.url, "events": ["audit.*"]})
        assert made.status_code == 201, made.text
        sub = made.json()
        templates_only = (await client.post(f"{API}/subscription", headers=alice["headers"], json={
            "url": "http://127.0.0.1:9/x", "events": ["run.failed", "audit.template.*"]})).json()
        tid = await make_template(client, alice)
        # each subscription's creation is an entry of alice's workspace too (the first
        # subscription's own included: it is made in that entry's transaction)
        requests = await asyncio.to_thread(receiver.wait_for, 3, 10.0)
        payloads = [Webhook(sub["secret"]).verify(r.body, r.headers) for r in requests]
        entry = await only(client, root, "template.create")
        assert {"type": "audit.template.create", **entry, "ts": entry["at"]} in payloads
        assert sorted(p["type"] for p in payloads) == ["audit.subscription.create"] * 2 + ["audit.template.create"]
    assert len(await deliveries_of(client, sub["subscription_id"])) == 3
    assert [d.event for d in await deliveries_of(client, templates_only["subscription_id"])] == [
        "audit.template.create"]
    listed = (await client.get(f"{API}/subscription/{sub['subscription_id']}/deliveries",
                               headers=alice["headers"])).json()["deliveries"]
    assert {d["trace_id"] for d in listed} == {None}
    # a refused change is no entry and no event; instance-level entries go to no subscription
    assert (await client.post(f"{API}/template", headers=alice["headers"], json={"name": "T", "steps": []})).status_code == 422
    await make_provider(client, admin, fake_llm)
    assert len(await deliveries_of(client, sub["subscription_id"])) == 3
    assert (await client.delete(f"{API}/template/{tid}", headers=alice["headers"])).status_code == 200
    assert [d.event for d in await deliveries_of(client, templates_only["subscription_id"])] == [
        "audit.template.create", "audit.template.delete"]
    for events in (["audit.nope"], ["audit.Template.*"], ["audit.*"] * 17):
        bad = await client.post(f"{API}/subscription", headers=alice["headers"],
                                json={"url": "http://127.0.0.1:9/x", "events": events})
        assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "events", (events, bad.text)
    await verified(client)


async def test_only_a_workspace_admin_hears_its_audit_events(client, alice, users):
    bob = await users.make("bob")
    wid = (await client.post("/api/v1/workspace", headers=alice["headers"], json={"name": "team"})).json()["workspace_id"]
    added = await client.post(f"/api/v1/workspace/{wid}/member", headers=alice["headers"],
                              json={"user_name": "bob", "role": "editor"})
    assert added.status_code == 201, added.text
    body = {"url": "http://127.0.0.1:9/x", "events": ["audit.*"], "workspace_id": wid}
    refused = await client.post(f"{API}/subscription", headers=bob["headers"], json=body)
    assert refused.status_code == 403 and refused.json()["detail"]["role_needed"] == "admin"
    runs_only = await client.post(f"{API}/subscription", headers=bob["headers"], json={**body, "events": ["run.failed"]})
    assert runs_only.status_code == 201, runs_only.text
    promoted = await client.put(f"/api/v1/workspace/{wid}/member/{bob['user_id']}", headers=alice["headers"],
                                json={"role": "admin"})
    assert promoted.status_code == 200, promoted.text
    made = await client.post(f"{API}/subscription", headers=bob["headers"], json=body)
    assert made.status_code == 201, made.text
    sid = made.json()["subscription_id"]
    assert (await client.post(f"{API}/template", headers=alice["headers"],
                              json={"name": "a", "steps": [{"id": "h", "agent": {"human": True}, "prompt": "?"}],
                                    "workspace_id": wid})).status_code == 201
    assert [d.event for d in await deliveries_of(client, sid)] == ["audit.subscription.create",
                                                                   "audit.template.create"]
    # demoted: bob no longer reads the log, his subscription hears nothing more
    demoted = await client.put(f"/api/v1/workspace/{wid}/member/{bob['user_id']}", headers=alice["headers"],
                               json={"role": "editor"})
    assert demoted.status_code == 200, demoted.text
    assert (await client.post(f"{API}/template", headers=alice["headers"],
                              json={"name": "b", "steps": [{"id": "h", "agent": {"human": True}, "prompt": "?"}],
                                    "workspace_id": wid})).status_code == 201
    assert len(await deliveries_of(client, sid)) == 2
    assert await deliveries_of(client, runs_only.json()["subscription_id"]) == []


async def test_uploaded_files(client, root, alice):
    upload = "/api/v1/adapter/client/upload"
    made = await client.post(upload, headers=alice["headers"], files=[
        ("file", ("a.txt", b"hello", "text/plain")), ("file", ("b.bin", b"xyz", "application/octet-stream"))])
    assert made.status_code == 201, made.text
    first, second = made.json()["files"]
    created = sorted(await entries(client, root, action="file.create"), key=lambda e: e["seq"])
    assert [e["target"] for e in created] == [{"type": "file", "id": first["file_id"], "name": "a.txt"},
                                                        {"type": "file", "id": second["file_id"], "name": "b.bin"}]
    assert {e["workspace_id"] for e in created} == {await personal_workspace(client, alice)}
    assert created[0]["actor"] == actor_of(alice)
    assert created[0]["changes"] == {"filename": {"from": None, "to": "a.txt"}, "size": {"from": None, "to": 5},
                                      "content_type": {"from": None, "to": "text/plain"},
                                      "sha256": {"from": None, "to": first["sha256"]}}
    count = len(await entries(client, root))
    too_big = await client.post(upload, headers=alice["headers"], files=[("file", ("c.bin", b"x" * 5000, "text/plain"))])
    assert too_big.status_code == 413
    assert (await client.delete(f"{upload}/nope", headers=alice["headers"])).status_code == 404
    await unchanged_count(client, root, count)
    assert (await client.delete(f"{upload}/{first['file_id']}", headers=alice["headers"])).status_code == 200
    deleted = await only(client, root, "file.delete")
    assert deleted["target"]["id"] == first["file_id"] and deleted["changes"]["size"] == {"from": 5, "to": None}
    await verified(client)
