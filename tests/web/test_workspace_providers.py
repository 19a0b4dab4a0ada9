"""A workspace's own model providers (SPEC §16), through the API on both stores: a
workspace's admins register, change, check and delete its providers (an editor gets 403
naming `admin`, a non-member 404, an instance ADMINISTRATOR included) and its members read
them; instance-wide ones stay ADMINISTRATOR+'s and every user's to read; names are unique
per workspace; a worker uses its workspace's providers or instance-wide ones, never another
workspace's (422 naming `provider_id`, read as an unknown provider), a system node only
instance-wide ones; a run of the workspace calls its provider with its key; deleting the
workspace deletes its providers; entries go to the workspace's audit chain."""

from __future__ import annotations

import json

import pytest

from orchestra.db.audit_models import AuditEntry
from orchestra.db.models import Provider, SystemNode, Worker
from tests.web.teams import two_teams
from tests.web.test_workflow_routes import API, assert_error, wait_for

PROVIDERS = "/api/v1/provider"
WORKERS = "/api/v1/agent/worker"
WS = "/api/v1/workspace"
TEAM_KEY = "sk-team-a-0123456789wxyz"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
async def team(client, users):
    return await two_teams(client, users)


async def register(client, who, name, workspace_id=None, **extra):
    body = {"name": name, "provider": "deepseek", "model_id": "deepseek-chat", **extra}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(PROVIDERS, json=body, headers=who["headers"])


async def made(client, who, name, workspace_id=None, **extra) -> str:
    response = await register(client, who, name, workspace_id, **extra)
    assert response.status_code == 201, response.text
    return response.json()["provider_id"]


async def worker_in(client, who, name, provider_id, workspace_id=None):
    body = {"name": name, "provider_id": provider_id}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(WORKERS, json=body, headers=who["headers"])


async def test_a_workspace_admin_manages_its_providers_others_cannot(client, team):
    a = team["a"]
    response = await register(client, team["bob"], "Main", a, api_key=TEAM_KEY)
    assert response.status_code == 201, response.text
    mine = response.json()
    assert mine["workspace_id"] == a and mine["name"] == "Main" and mine["api_key"] == "sk-…wxyz"
    assert TEAM_KEY not in response.text
    body = assert_error(await register(client, team["carol"], "other", a), 403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "admin" and "'admin'" in body["message"]
    for who in ("eve", "admin"):  # not a member: the workspace is not told, to an ADMINISTRATOR neither
        assert_error(await register(client, team[who], "other", a), 404, "NotFoundError")
    # a name is unique within the workspace (ignoring case); an instance-wide provider may have it too
    assert_error(await register(client, team["alice"], "main", a), 409, "ConflictError")
    instance = await register(client, team["admin"], "main")
    assert instance.status_code == 201 and instance.json()["workspace_id"] is None, instance.text
    wide = instance.json()["provider_id"]
    assert_error(await register(client, team["admin"], "MAIN"), 409, "ConflictError")
    # instance-wide providers stay ADMINISTRATOR+'s, a workspace admin's too
    assert_error(await register(client, team["bob"], "mine"), 403, "PermissionDeniedError")
    # every user is owner of their personal workspace
    [personal] = (await client.get(WS, headers=team["eve"]["headers"])).json()["workspaces"]
    own = await register(client, team["eve"], "main", personal["workspace_id"])
    assert own.status_code == 201 and own.json()["workspace_id"] == personal["workspace_id"], own.text
    assert await client.app.ctx.core.db.count(Provider.select()) == 3

    # lists: a workspace's (any member reads them), or the instance-wide ones (every user)
    listed = await client.get(PROVIDERS, params={"workspace_id": a}, headers=team["carol"]["headers"])
    assert listed.status_code == 200, listed.text
    assert [(p["name"], p["workspace_id"]) for p in listed.json()["providers"]] == [("Main", a)]
    assert TEAM_KEY not in listed.text
    for who in ("eve", "carol", "admin"):
        shown = await client.get(PROVIDERS, headers=team[who]["headers"])
        assert [(p["provider_id"], p["workspace_id"]) for p in shown.json()["providers"]] == [(wide, None)]
    for who in ("eve", "admin"):
        assert_error(await client.get(PROVIDERS, params={"workspace_id": a}, headers=team[who]["headers"]),
                     404, "NotFoundError")

    # one provider: read in its workspace; elsewhere it is not found
    url = f"{PROVIDERS}/{mine['provider_id']}"
    read = await client.get(url, params={"workspace_id": a}, headers=team["carol"]["headers"])
    assert read.status_code == 200 and read.json()["workspace_id"] == a, read.text
    assert_error(await client.get(url, headers=team["alice"]["headers"]), 404, "NotFoundError")
    assert_error(await client.get(url, params={"workspace_id": a}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")
    assert_error(await client.get(f"{PROVIDERS}/{wide}", params={"workspace_id": a},
                                  headers=team["bob"]["headers"]), 404, "NotFoundError")

    # change, check and delete: admin there; the instance-wide one is not reached through A
    assert_error(await client.put(url, params={"workspace_id": a}, json={"model_id": "x"},
                                  headers=team["carol"]["headers"]), 403, "PermissionDeniedError")
    assert_error(await client.put(url, params={"workspace_id": a}, json={"model_id": "x"},
                                  headers=team["eve"]["headers"]), 404, "NotFoundError")
    assert_error(await client.put(url, json={"model_id": "x"}, headers=team["admin"]["headers"]),
                 404, "NotFoundError")
    assert_error(await client.put(f"{PROVIDERS}/{wide}", params={"workspace_id": a}, json={"model_id": "x"},
                                  headers=team["bob"]["headers"]), 404, "NotFoundError")
    assert_error(await client.post(f"{url}/check", params={"workspace_id": a}, headers=team["carol"]["headers"]),
                 403, "PermissionDeniedError")
    assert_error(await client.post(f"{url}/check", headers=team["admin"]["headers"]), 404, "NotFoundError")
    checked = await client.post(f"{url}/check", params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert checked.status_code == 200 and "ok" in checked.json(), checked.text
    changed = await client.put(url, params={"workspace_id": a}, json={"name": "Team main", "model_id": "m2"},
                               headers=team["bob"]["headers"])
    assert changed.status_code == 200, changed.text
    assert (changed.json()["name"], changed.json()["model_id"], changed.json()["workspace_id"]) == \
        ("Team main", "m2", a)
    assert (await Provider.aget(Provider.id == wide)).model_id == "deepseek-chat"
    assert_error(await client.delete(url, params={"workspace_id": a}, headers=team["carol"]["headers"]),
                 403, "PermissionDeniedError")
    assert_error(await client.delete(url, headers=team["admin"]["headers"]), 404, "NotFoundError")
    gone = await client.delete(url, params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert gone.status_code == 200, gone.text
    assert await Provider.aget_or_none(Provider.id == mine["provider_id"]) is None
    assert await Provider.aget_or_none(Provider.id == wide) is not None

    # the audit entries are the workspace's (its chain), the key as "***"
    entries = await client.app.ctx.core.db.list(
        AuditEntry.select().where(AuditEntry.action.startswith("provider.")).order_by(AuditEntry.at, AuditEntry.seq))
    ours = [(e.chain, e.action) for e in entries if e.chain == a]
    assert ours == [(a, "provider.create"), (a, "provider.update"), (a, "provider.delete")]
    assert all(e.chain != a for e in entries if e.actor_name == "admin")
    assert TEAM_KEY not in json.dumps([e.changes for e in entries])
    log = await client.get("/api/v1/audit", params={"workspace_id": a, "action": "provider.create"},
                           headers=team["alice"]["headers"])
    assert log.status_code == 200, log.text
    [entry] = log.json()["entries"]
    assert entry["workspace_id"] == a and entry["changes"]["api_key"]["to"] == "***"


async def test_a_worker_uses_its_workspace_provider_or_an_instance_one_never_another(client, team):
    a, b = team["a"], team["b"]
    in_a = await made(client, team["bob"], "a-model", a)
    in_b = await made(client, team["bob"], "b-model", b)
    wide = await made(client, team["admin"], "shared-model")
    first = await worker_in(client, team["carol"], "hand", in_a, a)
    assert first.status_code == 201 and first.json()["provider_id"] == in_a, first.text
    assert first.json()["provider_name"] == "a-model"
    second = await worker_in(client, team["carol"], "hand2", wide, a)
    assert second.status_code == 201, second.text

    # another workspace's provider reads exactly as one that does not exist, to a member of both too
    unknown = await worker_in(client, team["carol"], "hand3", "f" * 8 + "-0000-4000-8000-" + "0" * 12, a)
    for who, provider_id, workspace_id in (("carol", in_b, a), ("bob", in_a, b), ("bob", in_b, None),
                                           ("eve", in_a, None)):
        refused = await worker_in(client, team[who], "elsewhere", provider_id, workspace_id)
        body = assert_error(refused, 422, "ValidationError")
        assert [d["field"] for d in body["detail"]] == ["provider_id"]
        assert body["detail"][0]["problem"].replace(provider_id, "P") == \
            unknown.json()["detail"][0]["problem"].replace("f" * 8 + "-0000-4000-8000-" + "0" * 12, "P")
    # a change is checked against the worker's own workspace
    hand = first.json()["worker_id"]
    moved = await client.put(f"{WORKERS}/{hand}", json={"provider_id": in_b}, headers=team["carol"]["headers"])
    body = assert_error(moved, 422, "ValidationError")
    assert [d["field"] for d in body["detail"]] == ["provider_id"]
    back = await client.put(f"{WORKERS}/{hand}", json={"provider_id": wide}, headers=team["bob"]["headers"])
    assert back.status_code == 200 and back.json()["provider_id"] == wide, back.text
    again = await client.put(f"{WORKERS}/{hand}", json={"provider_id": in_a}, headers=team["carol"]["headers"])
    assert again.status_code == 200 and again.json()["provider_id"] == in_a, again.text
    rows = await client.app.ctx.core.db.list(Worker.select().order_by(Worker.name))
    assert [(w.name, w.provider_id, w.workspace_id) for w in rows] == [("hand", in_a, a), ("hand2", wide, a)]
    # a provider in use by its workspace's worker is not deleted
    busy = await client.delete(f"{PROVIDERS}/{in_a}", params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert_error(busy, 409, "ConflictError")

    # a system node is instance-wide: a workspace's provider is not one it may use
    node = await client.put("/api/v1/agent/node/planner", json={"provider": in_a}, headers=team["admin"]["headers"])
    body = assert_error(node, 422, "ValidationError")
    assert [d["field"] for d in body["detail"]] == ["provider"]
    assert await client.app.ctx.core.db.count(SystemNode.select().where(SystemNode.provider == in_a)) == 0
    node = await client.put("/api/v1/agent/node/planner", json={"provider": wide}, headers=team["admin"]["headers"])
    assert node.status_code == 200 and node.json()["provider"] == wide, node.text


async def test_a_run_calls_its_workspace_provider_with_its_key(client, team, fake_llm):
    a = team["a"]
    provider = await made(client, team["bob"], "team-fake", a, provider="openai_compatible",
                          model_id="fake-model", base_url=fake_llm.base_url, api_key=TEAM_KEY)
    worker = await worker_in(client, team["carol"], "teamhand", provider, a)
    assert worker.status_code == 201, worker.text
    template = await client.post(f"{API}/template", headers=team["carol"]["headers"], json={
        "name": "uses-team-model", "workspace_id": a,
        "steps": [{"id": "s", "agent": {"worker": "teamhand"}, "prompt": "Say {{ input }}"}]})
    assert template.status_code == 201, template.text
    started = await client.post(f"{API}/run", headers=team["carol"]["headers"],
                                json={"template_id": template.json()["template_id"], "input": "hi"})
    assert started.status_code == 202, started.text
    run = await wait_for(client, team["carol"], started.json()["trace_id"], "succeeded", "failed", timeout=20)
    assert run["status"] == "succeeded", run.get("error")
    calls = [r for r in fake_llm.requests if r.method == "POST"]
    assert calls and all(r.headers.get("authorization") == f"Bearer {TEAM_KEY}" for r in calls)


async def test_deleting_the_workspace_deletes_its_providers(client, team):
    in_a = await made(client, team["bob"], "a-model", team["a"])
    in_b = await made(client, team["bob"], "a-model", team["b"])
    used = await worker_in(client, team["carol"], "hand", in_a, team["a"])
    assert used.status_code == 201, used.text
    deleted = await client.delete(f"{WS}/{team['a']}", headers=team["alice"]["headers"])
    assert deleted.status_code == 200, deleted.text
    rows = await client.app.ctx.core.db.list(Provider.select())
    assert [(r.id, r.workspace_id) for r in rows] == [(in_b, team["b"])]
    assert await client.app.ctx.core.db.count(Worker.select()) == 0


async def test_deleting_a_user_deletes_their_personal_providers(client, users, team):
    [personal] = (await client.get(WS, headers=team["eve"]["headers"])).json()["workspaces"]
    own = await made(client, team["eve"], "mine", personal["workspace_id"])
    assert (await worker_in(client, team["eve"], "hand", own)).status_code == 201
    wide = await made(client, team["admin"], "mine")
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    deleted = await client.delete(f"/api/v1/auth/{team['eve']['user_id']}", headers=root["headers"])
    assert deleted.status_code == 200, deleted.text
    rows = await client.app.ctx.core.db.list(Provider.select())
    assert [r.id for r in rows] == [wide]
