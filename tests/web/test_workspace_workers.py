"""A template step's worker never crosses workspaces (SPEC §16), through the API on both
stores: a step names a worker of the template's workspace, whoever of its editors made
it (by id or by name); another workspace's worker — a personal one in a team template,
a team one in a personal template — is a 422 naming the step's field at save, at
`POST /template/check` and at a restore, and nothing is stored; two workers of one
workspace sharing a name (names are unique per user) are named by id; a worker stored
before workspaces is its owner's personal one; a personal template with a personal
worker saves and runs as before."""

from __future__ import annotations

import pytest

from orchestra.db.models import TemplateVersion, Worker, WorkflowTemplate
from orchestra.services import providers
from tests.web.test_workflow_routes import API, assert_error, wait_for

WS = "/api/v1/workspace"
WORKERS = "/api/v1/agent/worker"
FIELD = "steps.0.agent.worker"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
async def team(client, users, fake_llm):
    """alice owns "support" where bob is editor; carol is not a member; an instance-wide
    provider on the fake model."""
    people = {name: await users.make(name) for name in ("alice", "bob", "carol")}
    made = await client.post(WS, headers=people["alice"]["headers"], json={"name": "support"})
    assert made.status_code == 201, made.text
    support = made.json()["workspace_id"]
    added = await client.post(f"{WS}/{support}/member", headers=people["alice"]["headers"],
                              json={"user_name": "bob", "role": "editor"})
    assert added.status_code == 201, added.text
    provider = await providers.create_provider(
        client.app.ctx.core, name="fake", kind="openai_compatible", model_id="fake-model", api_key="k",
        base_url=fake_llm.base_url)
    return {"support": support, "provider": provider.id, **people}


async def worker_of(client, team, who, name, workspace_id=None) -> str:
    body = {"name": name, "provider_id": team["provider"]}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    made = await client.post(WORKERS, headers=team[who]["headers"], json=body)
    assert made.status_code == 201, made.text
    return made.json()["worker_id"]


def steps_of(worker: str) -> list[dict]:
    return [{"id": "a", "agent": {"worker": worker}, "prompt": "Say {{input}}"}]


async def save(client, who, name, worker, workspace_id=None):
    body = {"name": name, "steps": steps_of(worker)}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(f"{API}/template", headers=who["headers"], json=body)


async def check(client, who, worker, workspace_id=None) -> dict:
    body = {"name": "draft", "steps": steps_of(worker)}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    checked = await client.post(f"{API}/template/check", headers=who["headers"], json=body)
    assert checked.status_code == 200, checked.text
    return checked.json()


def refused(response, worker: str) -> str:
    """The one problem of a save refused for its step's worker."""
    body = assert_error(response, 422, "ValidationError")
    assert [d["field"] for d in body["detail"]] == [FIELD], body
    problem = body["detail"][0]["problem"]
    assert f"{worker!r}" in problem and FIELD in body["message"]
    return problem


async def stored_names(client) -> set[str]:
    return {t.name for t in await client.app.ctx.core.db.list(WorkflowTemplate.select(WorkflowTemplate.name))}


async def run(client, who, template_id) -> dict:
    started = await client.post(f"{API}/run", headers=who["headers"], json={"template_id": template_id, "input": "hi"})
    assert started.status_code == 202, started.text
    return await wait_for(client, who, started.json()["trace_id"], "succeeded", "failed", timeout=20)


async def test_another_editor_s_worker_of_the_workspace_serves_its_templates(client, team):
    support, alice = team["support"], team["alice"]
    helper = await worker_of(client, team, "bob", "helper", support)
    by_name = await save(client, alice, "by-name", "HELPER", support)
    assert by_name.status_code == 201, by_name.text
    assert by_name.json()["template"]["steps"][0]["agent"] == {"worker": "helper"}  # read back by name
    stored = await WorkflowTemplate.aget_by_id(by_name.json()["template_id"])
    assert stored.workspace_id == support and stored.steps[0]["agent"] == {"worker": helper}
    by_id = await save(client, alice, "by-id", helper, support)
    assert by_id.status_code == 201, by_id.text
    assert await check(client, alice, "helper", support) == {"message": "success", "valid": True, "problems": []}
    done = await run(client, alice, by_name.json()["template_id"])
    assert done["status"] == "succeeded", done
    # bob, an editor, changes alice's template and keeps his worker in it
    changed = await client.put(f"{API}/template/{by_id.json()['template_id']}", headers=team["bob"]["headers"],
                               json={"name": "by-id", "steps": steps_of("helper")})
    assert changed.status_code == 200, changed.text


async def test_a_personal_worker_is_refused_in_a_team_template(client, team):
    support, alice = team["support"], team["alice"]
    await worker_of(client, team, "bob", "helper", support)
    mine = await worker_of(client, team, "alice", "mine")
    for ref in ("mine", mine):
        problem = refused(await save(client, alice, "leaky", ref, support), ref)
        assert "the workspace 'support'" in problem and "(its workers: helper)" in problem, problem
    assert "leaky" not in await stored_names(client)
    assert not await client.app.ctx.core.db.exists(TemplateVersion.select().where(TemplateVersion.version > 0))
    # the same through /template/check; the worker is fine in alice's personal workspace
    checked = await check(client, alice, "mine", support)
    assert checked["valid"] is False and [p["field"] for p in checked["problems"]] == [FIELD], checked
    assert "the workspace 'support'" in checked["problems"][0]["problem"]
    assert (await check(client, alice, "mine"))["valid"] is True
    # an update of a team template is refused alike, and changes nothing
    made = await save(client, alice, "team-t", "helper", support)
    assert made.status_code == 201, made.text
    tid = made.json()["template_id"]
    refused(await client.put(f"{API}/template/{tid}", headers=alice["headers"],
                             json={"name": "team-t", "steps": steps_of(mine)}), mine)
    stored = await WorkflowTemplate.aget_by_id(tid)
    assert stored.version == 1 and stored.steps[0]["agent"]["worker"] != mine


async def test_a_team_worker_is_refused_in_a_personal_template(client, team):
    support, alice = team["support"], team["alice"]
    theirs = await worker_of(client, team, "alice", "team-one", support)  # alice's own, but the team's
    await worker_of(client, team, "alice", "mine")
    for ref in ("team-one", theirs):
        problem = refused(await save(client, alice, "leaky", ref), ref)
        assert "one of your workers (yours: mine)" in problem, problem
    assert "leaky" not in await stored_names(client)
    checked = await check(client, alice, "team-one")
    assert checked["valid"] is False and [p["field"] for p in checked["problems"]] == [FIELD], checked
    # carol, no member, cannot name the team's worker either
    refused(await save(client, team["carol"], "leaky", theirs), theirs)


async def test_a_name_two_workers_of_the_workspace_share_is_named_by_id(client, team):
    support, alice = team["support"], team["alice"]
    hers = await worker_of(client, team, "alice", "twin", support)
    his = await worker_of(client, team, "bob", "twin", support)
    problem = refused(await save(client, alice, "twins", "twin", support), "twin")
    assert "ambiguous" in problem and hers in problem and his in problem, problem
    assert "twins" not in await stored_names(client)
    picked = await save(client, alice, "twins", his, support)
    assert picked.status_code == 201, picked.text
    assert (await WorkflowTemplate.aget_by_id(picked.json()["template_id"])).steps[0]["agent"] == {"worker": his}


async def test_a_personal_template_with_a_personal_worker_saves_and_runs(client, team):
    alice = team["alice"]
    mine = await worker_of(client, team, "alice", "mine")
    await worker_of(client, team, "bob", "mine")  # another user's worker of that name: not alice's
    made = await save(client, alice, "personal", "mine")
    assert made.status_code == 201, made.text
    tid = made.json()["template_id"]
    assert (await WorkflowTemplate.aget_by_id(tid)).steps[0]["agent"] == {"worker": mine}
    assert (await run(client, alice, tid))["status"] == "succeeded"
    # a worker stored before workspaces (no workspace_id) is its owner's personal one
    await client.app.ctx.core.db.aexecute(Worker.update(workspace_id=None).where(Worker.id == mine))
    again = await client.put(f"{API}/template/{tid}", headers=alice["headers"],
                             json={"name": "personal", "steps": steps_of("MINE")})
    assert again.status_code == 200, again.text
    assert (await run(client, alice, tid))["status"] == "succeeded"
    refused(await save(client, alice, "leaky", mine, team["support"]), mine)


async def test_a_restore_checks_the_workspace_s_workers_now(client, team):
    """A team template's version names another editor's worker: its restore saves while
    the worker is there, and is the 422 of a deleted worker once it is gone."""
    support, alice, bob = team["support"], team["alice"], team["bob"]
    helper = await worker_of(client, team, "bob", "helper", support)
    made = await save(client, alice, "team-t", "helper", support)
    assert made.status_code == 201, made.text
    tid = made.json()["template_id"]
    put = await client.put(f"{API}/template/{tid}", headers=alice["headers"],
                           json={"name": "team-t", "steps": [{"id": "a", "agent": {"human": True}, "prompt": "?"}]})
    assert put.status_code == 200, put.text
    restored = await client.post(f"{API}/template/{tid}/versions/1/restore", headers=alice["headers"])
    assert restored.status_code == 201, restored.text
    assert (await WorkflowTemplate.aget_by_id(tid)).steps[0]["agent"] == {"worker": helper}
    assert (await client.delete(f"{WORKERS}/{helper}", headers=bob["headers"])).status_code == 200
    refused(await client.post(f"{API}/template/{tid}/versions/1/restore", headers=alice["headers"]), helper)
    assert (await WorkflowTemplate.aget_by_id(tid)).version == 3
    done = await run(client, alice, tid)  # the stored template names a worker since deleted: as before
    assert done["status"] == "failed", done


# --- a workflow step's child template ---------------------------------------------------

CHILD_FIELD = "steps.0.workflow.template"


def calling(child: str) -> list[dict]:
    return [{"id": "sub", "workflow": {"template": child, "input": "input"}}]


async def parent(client, who, name, child, workspace_id=None):
    body = {"name": name, "steps": calling(child)}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post(f"{API}/template", headers=who["headers"], json=body)


def refused_child(response, child: str) -> str:
    body = assert_error(response, 422, "ValidationError")
    assert [d["field"] for d in body["detail"]] == [CHILD_FIELD], body
    problem = body["detail"][0]["problem"]
    assert f"unknown template {child!r}" in problem, problem
    return problem


async def test_a_team_template_calls_and_runs_another_editor_s_template_of_the_workspace(client, team):
    support, alice = team["support"], team["alice"]
    helper = await worker_of(client, team, "bob", "helper", support)
    leaf = await save(client, team["bob"], "leaf", helper, support)
    assert leaf.status_code == 201, leaf.text
    made = await parent(client, alice, "calls-leaf", "LEAF", support)
    assert made.status_code == 201, made.text
    stored = await WorkflowTemplate.aget_by_id(made.json()["template_id"])
    assert stored.steps[0]["workflow"]["template"] == leaf.json()["template_id"]
    done = await run(client, alice, made.json()["template_id"])  # alice starts bob's child
    assert done["status"] == "succeeded", done
    children = (await client.get(f"{API}/run", headers=alice["headers"],
                                 params={"workspace_id": support})).json()["runs"]
    assert len(children) == 2 and {r["status"] for r in children} == {"succeeded"}


async def test_a_child_of_another_workspace_is_refused(client, team, users):
    support, alice = team["support"], team["alice"]
    mine = await worker_of(client, team, "alice", "mine")
    solo = await save(client, alice, "solo", mine)
    assert solo.status_code == 201, solo.text
    for ref in ("solo", solo.json()["template_id"]):
        problem = refused_child(await parent(client, alice, "leaky", ref, support), ref)
        assert "the workspace 'support'" in problem, problem
    drafted = await client.post(f"{API}/template/check", headers=alice["headers"],
                                json={"name": "draft", "steps": calling("solo"), "workspace_id": support})
    assert drafted.status_code == 200 and [p["field"] for p in drafted.json()["problems"]] == [CHILD_FIELD], \
        drafted.text
    assert drafted.json()["valid"] is False
    # the other way: a team template is no child of a personal one
    helper = await worker_of(client, team, "alice", "helper", support)
    team_t = await save(client, alice, "team-t", helper, support)
    assert team_t.status_code == 201, team_t.text
    refused_child(await parent(client, alice, "leaky", team_t.json()["template_id"]), team_t.json()["template_id"])
    assert "leaky" not in await stored_names(client)
    # a shared template stays every workspace's
    admin = await users.make("admin", "ADMINISTRATOR")
    shared = await client.post(f"{API}/template", headers=admin["headers"], json={
        "name": "common", "shared": True, "steps": [{"id": "a", "agent": {"human": True}, "prompt": "?"}]})
    assert shared.status_code == 201, shared.text
    assert (await parent(client, alice, "calls-common", shared.json()["template_id"], support)).status_code == 201
