"""API keys belong to a workspace and a user (SPEC §16, §11), in process, on SQLite and
PostgreSQL: made there by an admin of it (by default in the user's personal workspace),
they reach that workspace only (anything of another one is 404, even where their user is
owner), their scopes never go beyond the user's role there at the moment of use (403
naming the role), and a user no longer a member holds a key that reaches nothing (401) —
also when the role changes on another process."""

from __future__ import annotations

import json

import asyncpg
import pytest

from orchestra.db.access_models import ApiKey
from orchestra.services.personal_workspace import personal_workspace_id
from tests.conftest import Users, make_settings, running_app
from tests.web.test_api_keys import bearer
from tests.web.test_workflow_routes import assert_error

KEYS = "/api/v1/auth/key"
WS = "/api/v1/workspace"
WF = "/api/v1/workflow"
STEPS = [{"id": "h", "agent": {"human": True}, "prompt": "Name for {{input}}?"}]
ALL_SCOPES = ["run:start", "run:read", "run:reply", "run:cancel", "template:read", "template:write"]
LEGACY = "2025-06-18"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
def database_url(both_stores):
    return both_stores




async def workspace(client, owner: dict, name: str, members: dict[str, str] | None = None,
                    people: dict | None = None) -> str:
    made = await client.post(WS, headers=owner["headers"], json={"name": name})
    assert made.status_code == 201, made.text
    workspace_id = made.json()["workspace_id"]
    for user_name, role in (members or {}).items():
        added = await client.post(f"{WS}/{workspace_id}/member", headers=owner["headers"],
                                  json={"user_name": user_name, "role": role})
        assert added.status_code == 201, added.text
    return workspace_id


async def template(client, who: dict, name: str, workspace_id: str | None = None, **more) -> str:
    body = {"name": name, "steps": STEPS, **more}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    made = await client.post(f"{WF}/template", headers=who["headers"], json=body)
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


async def start(client, headers: dict, template_id: str):
    return await client.post(f"{WF}/run", headers=headers, json={"template_id": template_id, "input": "x"})


async def make_key(client, who: dict, scopes=None, **body):
    return await client.post(KEYS, headers=who["headers"],
                             json={"name": "ci", "scopes": scopes or ALL_SCOPES, **body})


async def key_of(client, who: dict, workspace_id: str | None = None, **body) -> str:
    made = await make_key(client, who, **({"workspace_id": workspace_id} if workspace_id else {}), **body)
    assert made.status_code == 201, made.text
    return made.json()["key"]


@pytest.fixture
async def team(client, users):
    """alice owns workspaces `a` (bob: admin, carol: editor, dave: runner) and `b`
    (bob: owner too); eve is in neither."""
    people = {name: await users.make(name) for name in ("alice", "bob", "carol", "dave", "eve")}
    a = await workspace(client, people["alice"], "a", {"bob": "admin", "carol": "editor", "dave": "runner"})
    b = await workspace(client, people["alice"], "b", {"bob": "owner"})
    return {"a": a, "b": b, **people}


async def test_a_key_is_made_in_a_workspace_by_its_admins(client, team):
    a = team["a"]
    made = await make_key(client, team["bob"], workspace_id=a)
    assert made.status_code == 201, made.text
    assert made.json()["key_info"]["workspace_id"] == a
    row = await ApiKey.aget(ApiKey.id == made.json()["key_id"])
    assert row.workspace_id == a
    # an editor may not: 403 naming admin; a non-member is told nothing: 404
    refused = assert_error(await make_key(client, team["carol"], workspace_id=a), 403, "PermissionDeniedError")
    assert refused["detail"]["role_needed"] == "admin" and "'admin'" in refused["message"]
    assert_error(await make_key(client, team["eve"], workspace_id=a), 404, "NotFoundError")
    assert_error(await make_key(client, team["eve"], workspace_id="no-such-workspace"), 404, "NotFoundError")
    # another user's personal workspace is not found either
    core = client.app.ctx.core
    alices = await personal_workspace_id(core, team["alice"]["user_id"])
    assert_error(await make_key(client, team["bob"], workspace_id=alices), 404, "NotFoundError")
    # the default: the caller's personal workspace, where every user is owner
    mine = await make_key(client, team["carol"])
    assert mine.status_code == 201, mine.text
    carols = await personal_workspace_id(core, team["carol"]["user_id"])
    assert mine.json()["key_info"]["workspace_id"] == carols
    # the audit entry of its creation is in the key's workspace
    entries = (await client.get("/api/v1/audit", headers=team["bob"]["headers"],
                                params={"workspace_id": a, "action": "key.create"})).json()["entries"]
    assert [e["target"]["id"] for e in entries] == [made.json()["key_id"]]


async def test_a_keys_templates_are_of_its_workspace(client, team):
    in_a = await template(client, team["alice"], "in-a", team["a"])
    in_b = await template(client, team["alice"], "in-b", team["b"])
    made = await make_key(client, team["bob"], workspace_id=team["a"], templates=[in_a])
    assert made.status_code == 201 and made.json()["key_info"]["templates"] == [in_a]
    wrong = assert_error(await make_key(client, team["bob"], workspace_id=team["a"], templates=[in_a, in_b]),
                         422, "ValidationError")
    assert [d["field"] for d in wrong["detail"]] == ["templates.1"]


async def test_keys_are_listed_by_workspace(client, team):
    bob = team["bob"]
    in_a = (await make_key(client, bob, workspace_id=team["a"])).json()["key_id"]
    in_b = (await make_key(client, bob, workspace_id=team["b"])).json()["key_id"]
    personal = (await make_key(client, bob)).json()["key_id"]
    listed = (await client.get(KEYS, headers=bob["headers"])).json()["keys"]
    assert [k["key_id"] for k in listed] == [in_a, in_b, personal]
    assert [k["workspace_id"] for k in listed][:2] == [team["a"], team["b"]]
    only_a = await client.get(KEYS, headers=bob["headers"], params={"workspace_id": team["a"]})
    assert [k["key_id"] for k in only_a.json()["keys"]] == [in_a]
    assert_error(await client.get(KEYS, headers=team["eve"]["headers"], params={"workspace_id": team["a"]}),
                 404, "NotFoundError")


async def test_a_key_reaches_its_workspace_only(client, team):
    """bob owns b too, yet his key of a is told nothing of b."""
    bob = team["bob"]
    in_a = await template(client, team["alice"], "in-a", team["a"])
    in_b = await template(client, team["alice"], "in-b", team["b"])
    run_b = (await start(client, bob["headers"], in_b)).json()["trace_id"]
    own = await template(client, bob, "bobs")  # his personal workspace's
    key = bearer(await key_of(client, bob, team["a"]))

    assert (await client.get(f"{WF}/template/{in_a}", headers=key)).status_code == 200
    for path in (f"{WF}/template/{in_b}", f"{WF}/template/{own}", f"{WF}/template/{in_b}/versions",
                 f"{WF}/run/{run_b}", f"{WF}/run/{run_b}/events", f"{WF}/sse/{run_b}"):
        assert_error(await client.get(path, headers=key), 404, "NotFoundError")
    assert_error(await start(client, key, in_b), 404, "NotFoundError")
    assert_error(await client.post(f"{WF}/cancel/{run_b}", headers=key), 404, "NotFoundError")
    assert_error(await client.put(f"{WF}/template/{in_b}", headers=key, json={"name": "in-b", "steps": STEPS}),
                 404, "NotFoundError")
    # the run of b is untouched, and bob's token still reaches it
    assert (await client.get(f"{WF}/run/{run_b}", headers=bob["headers"])).json()["status"] != "cancelled"

    # lists: a's only; ?workspace_id= of another workspace is 404
    run_a = (await start(client, key, in_a)).json()["trace_id"]
    templates = (await client.get(f"{WF}/template", headers=key)).json()["templates"]
    assert [t["template_id"] for t in templates] == [in_a]
    runs = (await client.get(f"{WF}/run", headers=key)).json()["runs"]
    assert [r["trace_id"] for r in runs] == [run_a] and runs[0]["workspace_id"] == team["a"]
    for path in (f"{WF}/template", f"{WF}/run"):
        assert_error(await client.get(path, headers=key, params={"workspace_id": team["b"]}), 404, "NotFoundError")
        assert (await client.get(path, headers=key, params={"workspace_id": team["a"]})).status_code == 200
    # bob's token lists both workspaces' runs
    mine = (await client.get(f"{WF}/run", headers=bob["headers"])).json()["runs"]
    assert {r["trace_id"] for r in mine} == {run_a, run_b}

    # creation: the key's workspace by default (not the personal one); another is 404
    made = await client.post(f"{WF}/template", headers=key, json={"name": "made", "steps": STEPS})
    assert made.status_code == 201, made.text
    assert made.json()["template"]["workspace_id"] == team["a"]
    elsewhere = await client.post(f"{WF}/template", headers=key,
                                  json={"name": "made2", "steps": STEPS, "workspace_id": team["b"]})
    assert_error(elsewhere, 404, "NotFoundError")


async def test_a_keys_scopes_follow_its_users_role_at_the_moment_of_use(client, team):
    alice, dave = team["alice"], team["dave"]
    in_a = await template(client, alice, "in-a", team["a"])
    admin_key = bearer(await key_of(client, team["bob"], team["a"]))
    run = (await start(client, admin_key, in_a)).json()["trace_id"]
    assert (await client.put(f"{WS}/{team['a']}/member/{team['bob']['user_id']}", headers=alice["headers"],
                             json={"role": "viewer"})).status_code == 200
    refused = assert_error(await start(client, admin_key, in_a), 403, "PermissionDeniedError")
    assert refused["detail"]["role_needed"] == "runner"
    assert_error(await client.post(f"{WF}/cancel/{run}", headers=admin_key), 403, "PermissionDeniedError")
    written = await client.post(f"{WF}/template", headers=admin_key, json={"name": "n", "steps": STEPS})
    assert assert_error(written, 403, "PermissionDeniedError")["detail"]["role_needed"] == "editor"
    assert (await client.get(f"{WF}/run/{run}", headers=admin_key)).status_code == 200  # a viewer reads
    # dave makes a key as an admin, then is made runner: it starts runs, as a runner may
    assert (await client.put(f"{WS}/{team['a']}/member/{dave['user_id']}", headers=alice["headers"],
                             json={"role": "admin"})).status_code == 200
    dave_key = bearer(await key_of(client, dave, team["a"]))
    assert (await client.put(f"{WS}/{team['a']}/member/{dave['user_id']}", headers=alice["headers"],
                             json={"role": "runner"})).status_code == 200
    assert (await start(client, dave_key, in_a)).status_code == 202
    # removed: the key reaches nothing (401, as a revoked key), on every route
    assert (await client.delete(f"{WS}/{team['a']}/member/{dave['user_id']}",
                                headers=alice["headers"])).status_code == 200
    for answer in (await start(client, dave_key, in_a), await client.get(f"{WF}/run", headers=dave_key),
                   await client.get(f"{WF}/template/{in_a}", headers=dave_key)):
        assert_error(answer, 401, "TokenInvalidError")
    # back as a member, the same key works again
    assert (await client.post(f"{WS}/{team['a']}/member", headers=alice["headers"],
                              json={"user_name": "dave", "role": "runner"})).status_code == 201
    assert (await start(client, dave_key, in_a)).status_code == 202


async def test_a_personal_workspace_key_works_as_before(client, team):
    carol = team["carol"]
    own = await template(client, carol, "mine")
    in_a = await template(client, team["alice"], "in-a", team["a"])
    key = bearer(await key_of(client, carol))
    assert (await client.get(f"{WF}/template/{own}", headers=key)).status_code == 200
    started = await start(client, key, own)
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    run = (await client.get(f"{WF}/run/{trace_id}", headers=key)).json()
    assert run["owner_id"] == carol["user_id"]
    assert [r["trace_id"] for r in (await client.get(f"{WF}/run", headers=key)).json()["runs"]] == [trace_id]
    assert [t["template_id"] for t in (await client.get(f"{WF}/template", headers=key)).json()["templates"]] == [own]
    made = await client.post(f"{WF}/template", headers=key, json={"name": "made", "steps": STEPS})
    assert made.status_code == 201
    assert made.json()["template"]["workspace_id"] == await personal_workspace_id(
        client.app.ctx.core, carol["user_id"])
    # a team workspace's template, where carol edits, is not reached by this key
    assert_error(await client.get(f"{WF}/template/{in_a}", headers=key), 404, "NotFoundError")
    assert_error(await start(client, key, in_a), 404, "NotFoundError")


async def mcp_tools(client, headers: dict) -> list[str]:
    """The tool names a caller of `/mcp` is offered (a handshake-era session)."""
    def rpc(method, id=1, **params):
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        return message if id is None else {**message, "id": id}

    opened = await client.post("/mcp", headers={**headers, **ACCEPT}, json=rpc(
        "initialize", protocolVersion=LEGACY, capabilities={}, clientInfo={"name": "t", "version": "1"}))
    assert opened.status_code == 200, opened.text
    session = {**headers, **ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"],
               "mcp-protocol-version": LEGACY}
    assert (await client.post("/mcp", headers=session, json=rpc("notifications/initialized", id=None))
            ).status_code == 202
    listed = await client.post("/mcp", headers=session, json=rpc("tools/list", id=2))
    assert listed.status_code == 200, listed.text
    text = listed.text
    if listed.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[len("data:"):] for line in text.splitlines() if line.startswith("data:"))
    return sorted(tool["name"] for tool in json.loads(text)["result"]["tools"])


async def test_a_keys_mcp_tools_are_its_workspaces(client, team):
    bob = team["bob"]
    expose = {"expose": {"mcp": True}}
    await template(client, team["alice"], "tool_a", team["a"], **expose)
    await template(client, team["alice"], "tool_b", team["b"], **expose)
    await template(client, bob, "tool_own", **expose)
    assert await mcp_tools(client, bearer(await key_of(client, bob, team["a"]))) == ["tool_a"]
    assert await mcp_tools(client, bearer(await key_of(client, bob, team["b"]))) == ["tool_b"]
    assert await mcp_tools(client, bearer(await key_of(client, bob))) == ["tool_own"]
    # a viewer's key with run:start reaches no tool: /mcp needs runner there
    key_a = bearer(await key_of(client, bob, team["a"]))
    assert (await client.put(f"{WS}/{team['a']}/member/{bob['user_id']}", headers=team["alice"]["headers"],
                             json={"role": "viewer"})).status_code == 200
    refused = await client.post("/mcp", headers={**key_a, **ACCEPT}, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert assert_error(refused, 403, "PermissionDeniedError")["detail"]["role_needed"] == "runner"
    assert await mcp_tools(client, bearer(await key_of(client, bob, team["b"]))) == ["tool_b"]


async def test_a_demotion_on_one_process_counts_at_once_for_a_key_used_on_another(tmp_path, postgres_url):
    """Two processes' worth of app (each its own Core, key cache and signals) on one
    PostgreSQL database: the key is used on `there` (its cache warm), the role changes on
    `here`, and the key's next use on `there` follows."""
    here_settings = make_settings(tmp_path / "here", postgres_url)
    there_settings = make_settings(tmp_path / "there", postgres_url)
    async with running_app(here_settings) as here, running_app(there_settings) as there:
        users = Users(here)
        alice, bob = await users.make("alice"), await users.make("bob")
        a = await workspace(here, alice, "a", {"bob": "admin"})
        in_a = await template(here, alice, "in-a", a)
        key = bearer(await key_of(here, bob, a))
        assert (await start(there, key, in_a)).status_code == 202
        assert (await there.get(f"{WF}/template/{in_a}", headers=key)).status_code == 200

        assert (await here.put(f"{WS}/{a}/member/{bob['user_id']}", headers=alice["headers"],
                               json={"role": "viewer"})).status_code == 200
        refused = assert_error(await start(there, key, in_a), 403, "PermissionDeniedError")
        assert refused["detail"]["role_needed"] == "runner"
        assert (await there.get(f"{WF}/template/{in_a}", headers=key)).status_code == 200

        assert (await here.delete(f"{WS}/{a}/member/{bob['user_id']}", headers=alice["headers"])).status_code == 200
        assert_error(await there.get(f"{WF}/template/{in_a}", headers=key), 401, "TokenInvalidError")


async def _write_unsignalled(postgres_url: str, sql: str, *args) -> None:
    """A change whose PostgreSQL signal has not reached this process (its triggers off):
    what a request on another process sees in the moment before the NOTIFY arrives."""
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("SET session_replication_role = replica")
        await conn.execute(sql, *args)
    finally:
        await conn.close()


async def test_a_key_revoked_or_demoted_before_the_signal_arrives_is_judged_as_stored(tmp_path, postgres_url):
    """The key cache is a hint: the key and its user's role are read with the workspace
    role at every use, so a revocation or demotion counts even while its signal is on its
    way (CI caught a revoked key answered 200 on the other process under load)."""
    async with running_app(make_settings(tmp_path, postgres_url)) as client:
        users = Users(client)
        root = await users.make("root", role="SUPER_ADMINISTRATOR")
        made = (await make_key(client, root, ["run:read"])).json()
        key = bearer(made["key"])
        assert (await client.get(f"{WF}/run?all=1", headers=key)).status_code == 200  # cached now
        await _write_unsignalled(postgres_url, "UPDATE \"user\" SET role = 'USER' WHERE id = $1",
                                 root["user_id"])
        assert_error(await client.get(f"{WF}/run?all=1", headers=key), 403, "PermissionDeniedError")
        await _write_unsignalled(postgres_url, "UPDATE api_key SET revoked_at = now() WHERE id = $1",
                                 made["key_id"])
        revoked = assert_error(await client.get(f"{WF}/run", headers=key), 401, "TokenInvalidError")
        assert "revoked" in revoked["message"]
