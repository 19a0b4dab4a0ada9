"""A workspace's own MCP servers (SPEC §16), through the API on both stores, against the
real streamable-HTTP fake MCP server: a workspace's admins register, replace, refresh and
delete its servers (an editor gets 403 naming `admin`, a non-member 404, an instance
ADMINISTRATOR included) and its members read them; instance-wide ones stay
ADMINISTRATOR+'s; names are unique per workspace; a workspace's servers' tools are in its
catalog alone, and a worker of another workspace naming one gets 422 naming `tools.N`; a
run of the workspace calls its own server where it has one of an instance-wide server's
name; deleting the workspace deletes its servers; entries go to its audit chain."""

from __future__ import annotations

import json

import pytest

from orchestra.db.audit_models import AuditEntry
from orchestra.db.models import McpServer, RunEvent, Worker
from orchestra.engine.tools import wire_name
from tests.web.teams import two_teams
from tests.web.test_workflow_routes import API, assert_error, wait_for

MCP = "/api/v1/resource/mcp"
TOOLS = "/api/v1/resource/tool"
WORKERS = "/api/v1/agent/worker"
WS = "/api/v1/workspace"
TEAM_SECRET = "team-a-header-0123456789"
INSTANCE_SECRET = "instance-header-9876543210"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
async def team(client, users):
    return await two_teams(client, users)


async def register(client, who, fake, name, workspace_id=None, secret=TEAM_SECRET):
    body = {"name": name, "transport": "streamable_http", "url": fake.url, "headers": {"X-Api-Key": secret}}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(MCP, json=body, headers=who["headers"])


async def made(client, who, fake, name, workspace_id=None, secret=TEAM_SECRET) -> str:
    response = await register(client, who, fake, name, workspace_id, secret)
    assert response.status_code == 201, response.text
    return response.json()["server_id"]


async def instance_provider(client, team, base_url="http://127.0.0.1:9/v1") -> str:
    response = await client.post("/api/v1/provider", headers=team["admin"]["headers"], json={
        "name": "p", "provider": "openai_compatible", "model_id": "fake-model", "base_url": base_url})
    assert response.status_code == 201, response.text
    return response.json()["provider_id"]


async def worker_in(client, who, name, provider_id, tools, workspace_id=None):
    body = {"name": name, "provider_id": provider_id, "tools": tools}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(WORKERS, json=body, headers=who["headers"])


async def test_a_workspace_admin_manages_its_servers_others_cannot(client, team, fake_mcp):
    a = team["a"]
    response = await register(client, team["bob"], fake_mcp, "crm", a)
    assert response.status_code == 201, response.text
    server = response.json()["server"]
    assert server["workspace_id"] == a and server["name"] == "crm" and server["headers"] == {"X-Api-Key": "…6789"}
    assert TEAM_SECRET not in response.text and "crm.echo" in [t["name"] for t in server["tools"]]
    body = assert_error(await register(client, team["carol"], fake_mcp, "other", a), 403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "admin" and "'admin'" in body["message"]
    for who in ("eve", "admin"):  # not a member: the workspace is not told, to an ADMINISTRATOR neither
        assert_error(await register(client, team[who], fake_mcp, "other", a), 404, "NotFoundError")
    # a name is unique within the workspace (ignoring case); an instance-wide server may have it too
    assert_error(await register(client, team["alice"], fake_mcp, "CRM", a), 409, "ConflictError")
    wide = await made(client, team["admin"], fake_mcp, "crm", secret=INSTANCE_SECRET)
    assert_error(await register(client, team["admin"], fake_mcp, "Crm"), 409, "ConflictError")
    # instance-wide servers stay ADMINISTRATOR+'s, a workspace admin's too
    assert_error(await register(client, team["bob"], fake_mcp, "mine"), 403, "PermissionDeniedError")
    assert await client.app.ctx.core.db.count(McpServer.select()) == 2

    # lists: a workspace's (any member reads them), or the instance-wide ones (every user)
    listed = await client.get(MCP, params={"workspace_id": a}, headers=team["carol"]["headers"])
    assert listed.status_code == 200, listed.text
    assert [(s["server_id"], s["workspace_id"]) for s in listed.json()["servers"]] == [(server["server_id"], a)]
    for who in ("eve", "carol", "admin"):
        shown = await client.get(MCP, headers=team[who]["headers"])
        assert [(s["server_id"], s["workspace_id"]) for s in shown.json()["servers"]] == [(wide, None)]
    for text in (listed.text, shown.text):
        assert TEAM_SECRET not in text and INSTANCE_SECRET not in text
    assert_error(await client.get(MCP, params={"workspace_id": a}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")

    # one server: read in its workspace; elsewhere it is not found
    url = f"{MCP}/{server['server_id']}"
    read = await client.get(url, params={"workspace_id": a}, headers=team["carol"]["headers"])
    assert read.status_code == 200 and read.json()["server"]["workspace_id"] == a, read.text
    assert_error(await client.get(url, headers=team["alice"]["headers"]), 404, "NotFoundError")
    assert_error(await client.get(f"{MCP}/{wide}", params={"workspace_id": a}, headers=team["bob"]["headers"]),
                 404, "NotFoundError")

    # replace, refresh and delete: admin there; the instance-wide one is not reached through A
    again = {"name": "crm-two", "transport": "streamable_http", "url": fake_mcp.url,
             "headers": {"X-Api-Key": "…6789"}}
    assert_error(await client.put(url, params={"workspace_id": a}, json=again, headers=team["carol"]["headers"]),
                 403, "PermissionDeniedError")
    assert_error(await client.put(url, json=again, headers=team["admin"]["headers"]), 404, "NotFoundError")
    assert_error(await client.put(f"{MCP}/{wide}", params={"workspace_id": a}, json=again,
                                  headers=team["bob"]["headers"]), 404, "NotFoundError")
    assert_error(await client.post(f"{url}/refresh", params={"workspace_id": a}, headers=team["carol"]["headers"]),
                 403, "PermissionDeniedError")
    assert_error(await client.post(f"{url}/refresh", headers=team["admin"]["headers"]), 404, "NotFoundError")
    refreshed = await client.post(f"{url}/refresh", params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert refreshed.status_code == 200 and refreshed.json()["server"]["last_error"] is None, refreshed.text
    replaced = await client.put(url, params={"workspace_id": a}, json=again, headers=team["bob"]["headers"])
    assert replaced.status_code == 200, replaced.text
    assert (replaced.json()["server"]["name"], replaced.json()["server"]["workspace_id"]) == ("crm-two", a)
    row = await McpServer.aget(McpServer.id == server["server_id"])
    assert json.loads(client.app.ctx.core.secrets.decrypt(row.headers_encrypted)) == {"X-Api-Key": TEAM_SECRET}
    assert (await McpServer.aget(McpServer.id == wide)).name == "crm"
    assert_error(await client.delete(url, params={"workspace_id": a}, headers=team["carol"]["headers"]),
                 403, "PermissionDeniedError")
    assert_error(await client.delete(url, headers=team["admin"]["headers"]), 404, "NotFoundError")
    gone = await client.delete(url, params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert gone.status_code == 200, gone.text
    assert [r.id for r in await client.app.ctx.core.db.list(McpServer.select())] == [wide]

    # the audit entries are the workspace's (its chain), header values as "***"
    entries = await client.app.ctx.core.db.list(
        AuditEntry.select().where(AuditEntry.action.startswith("mcp_server.")).order_by(AuditEntry.at, AuditEntry.seq))
    ours = [(e.chain, e.action) for e in entries if e.chain == a]
    assert ours == [(a, "mcp_server.create"), (a, "mcp_server.update"), (a, "mcp_server.delete")]
    assert all(e.chain != a for e in entries if e.actor_name == "admin")
    assert TEAM_SECRET not in json.dumps([e.changes for e in entries])
    log = await client.get("/api/v1/audit", params={"workspace_id": a, "action": "mcp_server.create"},
                           headers=team["alice"]["headers"])
    assert log.status_code == 200, log.text
    [entry] = log.json()["entries"]
    assert entry["workspace_id"] == a and entry["changes"]["headers"]["to"] == {"X-Api-Key": "***"}


async def test_a_workspace_servers_tools_are_its_workers_alone(client, team, fake_mcp):
    a, b = team["a"], team["b"]
    server = await made(client, team["bob"], fake_mcp, "teamcrm", a)
    provider = await instance_provider(client, team)
    # the catalog: the workspace's tools for its members, never for anyone else
    plain = await client.get(TOOLS, headers=team["carol"]["headers"])
    assert plain.status_code == 200 and "teamcrm.echo" not in [t["name"] for t in plain.json()["tools"]]
    in_a = await client.get(TOOLS, params={"workspace_id": a}, headers=team["carol"]["headers"])
    assert in_a.status_code == 200, in_a.text
    by_name = {t["name"]: t for t in in_a.json()["tools"]}
    assert by_name["teamcrm.echo"]["source"] == {"mcp": server} and "calculator" in by_name
    in_b = await client.get(TOOLS, params={"workspace_id": b}, headers=team["bob"]["headers"])
    assert "teamcrm.echo" not in [t["name"] for t in in_b.json()["tools"]]
    assert_error(await client.get(TOOLS, params={"workspace_id": a}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")

    # a worker of A may use them; one of B, or a personal one, may not (a member of both included)
    hand = await worker_in(client, team["carol"], "hand", provider, ["teamcrm.echo", "calculator"], a)
    assert hand.status_code == 201 and hand.json()["tools"] == ["teamcrm.echo", "calculator"], hand.text
    unknown = await worker_in(client, team["carol"], "x", provider, ["nobody.echo"], a)
    for who, workspace_id in (("bob", b), ("bob", None), ("eve", None)):
        refused = await worker_in(client, team[who], "elsewhere", provider, ["calculator", "teamcrm.echo"],
                                  workspace_id)
        body = assert_error(refused, 422, "ValidationError")
        assert [d["field"] for d in body["detail"]] == ["tools.1"]
        problem = body["detail"][0]["problem"]
        assert problem.startswith("unknown tool 'teamcrm.echo'") and "teamcrm" not in problem.split(";", 1)[1]
        assert unknown.json()["detail"][0]["problem"].startswith("unknown tool 'nobody.echo'")
    in_b_worker = await worker_in(client, team["bob"], "bhand", provider, ["calculator"], b)
    assert in_b_worker.status_code == 201, in_b_worker.text
    moved = await client.put(f"{WORKERS}/{in_b_worker.json()['worker_id']}", json={"tools": ["teamcrm.echo"]},
                             headers=team["bob"]["headers"])
    body = assert_error(moved, 422, "ValidationError")
    assert [d["field"] for d in body["detail"]] == ["tools.0"]

    # in use by A's worker: not deleted; a rename carries A's workers along, and only them
    busy = await client.delete(f"{MCP}/{server}", params={"workspace_id": a}, headers=team["bob"]["headers"])
    assert_error(busy, 409, "ConflictError")
    wide = await made(client, team["admin"], fake_mcp, "teamcrm", secret=INSTANCE_SECRET)
    eves = await worker_in(client, team["eve"], "evehand", provider, ["teamcrm.echo"])
    assert eves.status_code == 201, eves.text  # the instance-wide server's tool, in eve's workspace
    renamed = await client.put(f"{MCP}/{server}", params={"workspace_id": a}, headers=team["bob"]["headers"],
                               json={"name": "crm", "transport": "streamable_http", "url": fake_mcp.url})
    assert renamed.status_code == 200, renamed.text
    tools = {w.name: w.tools for w in await client.app.ctx.core.db.list(Worker.select())}
    assert tools["hand"] == ["crm.echo", "calculator"] and tools["evehand"] == ["teamcrm.echo"]
    # the instance-wide one's delete sees eve's worker, not A's
    busy = await client.delete(f"{MCP}/{wide}", headers=team["admin"]["headers"])
    assert [w["name"] for w in assert_error(busy, 409, "ConflictError")["detail"]["workers"]] == ["evehand"]


async def run_calling(client, who, fake_llm, worker: str, workspace_id=None) -> str:
    """Run a one-step template of `worker` whose model calls `crm.header`: the header value
    the MCP server was sent."""
    fake_llm.script_tool_call(wire_name("crm.header"), {"name": "X-Api-Key"})
    fake_llm.script_text("Done.")
    body = {"name": f"t-{worker}", "steps": [{"id": "s", "agent": {"worker": worker}, "prompt": "Go"}]}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    template = await client.post(f"{API}/template", headers=who["headers"], json=body)
    assert template.status_code == 201, template.text
    started = await client.post(f"{API}/run", headers=who["headers"],
                                json={"template_id": template.json()["template_id"], "input": "x"})
    assert started.status_code == 202, started.text
    run = await wait_for(client, who, started.json()["trace_id"], "succeeded", "failed", timeout=20)
    assert run["status"] == "succeeded", run.get("error")
    events = await client.app.ctx.core.db.list(
        RunEvent.select().where((RunEvent.run == run["trace_id"]) & (RunEvent.kind == "tool_result")))
    [result] = [e.data for e in events]
    return result["result"]


async def test_a_run_calls_its_workspace_server_over_an_instance_one(client, team, fake_mcp, fake_llm):
    await made(client, team["admin"], fake_mcp, "crm", secret=INSTANCE_SECRET)
    await made(client, team["bob"], fake_mcp, "crm", team["a"], secret=TEAM_SECRET)
    provider = await instance_provider(client, team, fake_llm.base_url)
    assert (await worker_in(client, team["carol"], "teamhand", provider, ["crm.header"], team["a"])).status_code == 201
    assert (await worker_in(client, team["eve"], "evehand", provider, ["crm.header"])).status_code == 201
    assert await run_calling(client, team["carol"], fake_llm, "teamhand", team["a"]) == TEAM_SECRET
    assert await run_calling(client, team["eve"], fake_llm, "evehand") == INSTANCE_SECRET


async def test_deleting_the_workspace_deletes_its_servers(client, team, fake_mcp):
    await made(client, team["bob"], fake_mcp, "crm", team["a"])
    in_b = await made(client, team["bob"], fake_mcp, "crm", team["b"])
    provider = await instance_provider(client, team)
    assert (await worker_in(client, team["carol"], "hand", provider, ["crm.echo"], team["a"])).status_code == 201
    deleted = await client.delete(f"{WS}/{team['a']}", headers=team["alice"]["headers"])
    assert deleted.status_code == 200, deleted.text
    rows = await client.app.ctx.core.db.list(McpServer.select())
    assert [(r.id, r.workspace_id) for r in rows] == [(in_b, team["b"])]
    in_b_tools = await client.get(TOOLS, params={"workspace_id": team["b"]}, headers=team["bob"]["headers"])
    assert "crm.echo" in [t["name"] for t in in_b_tools.json()["tools"]]
