"""Templates and runs in workspaces (SPEC §16) in process: created in a team workspace by
its editors, run by its runners, read by its viewers; a non-member (an instance
ADMINISTRATOR too) is told nothing (404); lists take ?workspace_id= and show it."""

from __future__ import annotations

import pytest

WS = "/api/v1/workspace"
WF = "/api/v1/workflow"
STEPS = [{"id": "h", "agent": {"human": True}, "prompt": "Name for {{input}}?"}]


@pytest.fixture
def database_url(both_stores):
    return both_stores


def assert_error(response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and body["message"]
    return body


@pytest.fixture
async def team(client, users):
    """alice owns a team workspace where bob edits, carol runs and dave views; eve is no member."""
    people = {name: await users.make(name) for name in ("alice", "bob", "carol", "dave", "eve")}
    people["admin"] = await users.make("admin", "ADMINISTRATOR")
    made = await client.post(WS, headers=people["alice"]["headers"], json={"name": "team"})
    workspace_id = made.json()["workspace_id"]
    for name, role in (("bob", "editor"), ("carol", "runner"), ("dave", "viewer")):
        added = await client.post(f"{WS}/{workspace_id}/member", headers=people["alice"]["headers"],
                                  json={"user_name": name, "role": role})
        assert added.status_code == 201, added.text
    return {"workspace_id": workspace_id, **people}


async def create(client, who, **body):
    return await client.post(f"{WF}/template", headers=who["headers"], json={"name": "t", "steps": STEPS, **body})


async def test_templates_default_to_the_personal_workspace(client, team):
    made = await create(client, team["eve"])
    assert made.status_code == 201, made.text
    [personal] = (await client.get(WS, headers=team["eve"]["headers"])).json()["workspaces"]
    assert made.json()["template"]["workspace_id"] == personal["workspace_id"]
    listed = await client.get(f"{WF}/template", params={"workspace_id": personal["workspace_id"]},
                              headers=team["eve"]["headers"])
    assert [t["template_id"] for t in listed.json()["templates"]] == [made.json()["template_id"]]


async def test_editors_change_templates_runners_run_viewers_read(client, team):
    wid = team["workspace_id"]
    body = assert_error(await create(client, team["carol"], workspace_id=wid), 403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "editor"
    assert_error(await create(client, team["eve"], workspace_id=wid), 404, "NotFoundError")
    made = await create(client, team["bob"], workspace_id=wid)
    assert made.status_code == 201, made.text
    template = made.json()["template"]
    assert template["workspace_id"] == wid and template["owner_id"] == team["bob"]["user_id"]
    tid = template["template_id"]
    # a name is one template of the workspace's
    assert_error(await create(client, team["alice"], workspace_id=wid), 409, "ConflictError")
    url = f"{WF}/template/{tid}"
    change = {"name": "t2", "steps": STEPS}
    for who in ("carol", "dave"):
        body = assert_error(await client.put(url, headers=team[who]["headers"], json=change), 403,
                            "PermissionDeniedError")
        assert body["detail"]["role_needed"] == "editor"
        assert (await client.get(url, headers=team[who]["headers"])).status_code == 200
    assert (await client.put(url, headers=team["alice"]["headers"], json=change)).status_code == 200
    for who in ("eve", "admin"):
        assert_error(await client.get(url, headers=team[who]["headers"]), 404, "NotFoundError")
    # runs: a runner starts, answers and cancels; a viewer reads; non-members see nothing
    body = assert_error(await client.post(f"{WF}/run", headers=team["dave"]["headers"],
                                          json={"template_id": tid, "input": "x"}), 403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "runner"
    assert_error(await client.post(f"{WF}/run", headers=team["eve"]["headers"],
                                   json={"template_id": tid, "input": "x"}), 404, "NotFoundError")
    started = await client.post(f"{WF}/run", headers=team["carol"]["headers"], json={"template_id": tid, "input": "x"})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    seen = await client.get(f"{WF}/run/{trace_id}", headers=team["dave"]["headers"])
    assert seen.status_code == 200, seen.text
    run = seen.json()
    assert run["workspace_id"] == wid and run["owner_id"] == team["carol"]["user_id"]
    for who in ("eve", "admin"):
        assert_error(await client.get(f"{WF}/run/{trace_id}", headers=team[who]["headers"]), 404, "NotFoundError")
    body = assert_error(await client.post(f"{WF}/cancel/{trace_id}", headers=team["dave"]["headers"]),
                        403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "runner"
    cancelled = await client.post(f"{WF}/cancel/{trace_id}", headers=team["bob"]["headers"])
    assert cancelled.status_code == 200, cancelled.text
    # lists: every workspace of the caller's by default, one with ?workspace_id=
    for who in ("alice", "dave"):
        runs = (await client.get(f"{WF}/run", headers=team[who]["headers"])).json()["runs"]
        assert [r["trace_id"] for r in runs] == [trace_id]
        only = await client.get(f"{WF}/run", params={"workspace_id": wid}, headers=team[who]["headers"])
        assert [r["trace_id"] for r in only.json()["runs"]] == [trace_id]
        templates = (await client.get(f"{WF}/template", params={"workspace_id": wid},
                                      headers=team[who]["headers"])).json()["templates"]
        assert [t["template_id"] for t in templates] == [tid]
    assert (await client.get(f"{WF}/run", headers=team["eve"]["headers"])).json()["runs"] == []
    assert_error(await client.get(f"{WF}/run", params={"workspace_id": wid}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")
    assert_error(await client.get(f"{WF}/template", params={"workspace_id": wid}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")
    every = (await client.get(f"{WF}/run", params={"all": "true"}, headers=team["admin"]["headers"])).json()["runs"]
    assert trace_id not in {r["trace_id"] for r in every}  # an ADMINISTRATOR is no member here
    # a deleted template's workspace is gone with its runs
    body = assert_error(await client.delete(f"{WS}/{wid}", headers=team["bob"]["headers"]), 403,
                        "PermissionDeniedError")
    assert (await client.delete(f"{WS}/{wid}", headers=team["alice"]["headers"])).status_code == 200
    assert_error(await client.get(url, headers=team["alice"]["headers"]), 404, "NotFoundError")


async def test_a_workspace_with_an_active_run_is_not_deleted(client, team):
    wid = team["workspace_id"]
    tid = (await create(client, team["bob"], workspace_id=wid)).json()["template_id"]
    started = await client.post(f"{WF}/run", headers=team["carol"]["headers"], json={"template_id": tid, "input": "x"})
    assert started.status_code == 202
    assert_error(await client.delete(f"{WS}/{wid}", headers=team["alice"]["headers"]), 409, "ConflictError")


SCHEDULE = f"{WF}/schedule"
HOOK = f"{WF}/hook"


async def test_schedules_and_hooks_belong_to_a_workspace(client, team):
    """A schedule's or hook's workspace is the body's (editor there; default personal); its
    template is of that workspace; members read it, editors change it, others get 404."""
    wid = team["workspace_id"]
    team_tid = (await create(client, team["bob"], workspace_id=wid)).json()["template_id"]
    own_tid = (await create(client, team["bob"], name="own")).json()["template_id"]
    for path, body in ((SCHEDULE, {"cron": "0 9 * * *"}), (HOOK, {})):
        # a runner may not make one; a non-member is told nothing
        refused = assert_error(await client.post(path, headers=team["carol"]["headers"],
                                                 json={**body, "template_id": team_tid, "workspace_id": wid}),
                               403, "PermissionDeniedError")
        assert refused["detail"]["role_needed"] == "editor"
        assert_error(await client.post(path, headers=team["eve"]["headers"],
                                       json={**body, "template_id": team_tid, "workspace_id": wid}),
                     404, "NotFoundError")
        # a reference never crosses workspaces: 422 naming the field, nothing stored
        for tid, where in ((own_tid, wid), (team_tid, None)):
            crossed = assert_error(await client.post(path, headers=team["bob"]["headers"], json={
                **body, "template_id": tid, **({"workspace_id": where} if where else {})}),
                422, "ValidationError")
            assert crossed["detail"][0]["field"] == "template_id"
        kind = "schedule" if path == SCHEDULE else "hook"
        assert (await client.get(path, headers=team["bob"]["headers"])).json()[f"{kind}s"] == []
        made = await client.post(path, headers=team["bob"]["headers"],
                                 json={**body, "template_id": team_tid, "workspace_id": wid})
        assert made.status_code == 201, made.text
        item_id = made.json()[f"{kind}_id"]
        assert made.json()[kind]["workspace_id"] == wid
        mine = await client.post(path, headers=team["bob"]["headers"], json={**body, "template_id": own_tid})
        assert mine.status_code == 201, mine.text
        assert mine.json()[kind]["workspace_id"] != wid and mine.json()[kind]["workspace_id"]
        # members see it (by default and with ?workspace_id=), non-members do not
        for who in ("alice", "dave"):
            listed = (await client.get(path, headers=team[who]["headers"])).json()[f"{kind}s"]
            assert [x[f"{kind}_id"] for x in listed] == [item_id]
            only = (await client.get(path, params={"workspace_id": wid},
                                     headers=team[who]["headers"])).json()[f"{kind}s"]
            assert [x[f"{kind}_id"] for x in only] == [item_id]
            assert (await client.get(f"{path}/{item_id}", headers=team[who]["headers"])).status_code == 200
        bobs = (await client.get(path, headers=team["bob"]["headers"])).json()[f"{kind}s"]
        assert {x[f"{kind}_id"] for x in bobs} == {item_id, mine.json()[f"{kind}_id"]}
        personal_id = mine.json()[kind]["workspace_id"]
        only_mine = (await client.get(path, params={"workspace_id": personal_id},
                                      headers=team["bob"]["headers"])).json()[f"{kind}s"]
        assert [x[f"{kind}_id"] for x in only_mine] == [mine.json()[f"{kind}_id"]]
        for who in ("eve", "admin"):
            assert_error(await client.get(f"{path}/{item_id}", headers=team[who]["headers"]), 404, "NotFoundError")
            assert item_id not in {x[f"{kind}_id"] for x in
                                   (await client.get(path, headers=team[who]["headers"])).json()[f"{kind}s"]}
        assert_error(await client.get(path, params={"workspace_id": wid}, headers=team["eve"]["headers"]),
                     404, "NotFoundError")
        # a viewer or runner may not delete it; a non-member is told nothing; an editor may
        for who in ("carol", "dave"):
            refused = assert_error(await client.delete(f"{path}/{item_id}", headers=team[who]["headers"]),
                                   403, "PermissionDeniedError")
            assert refused["detail"]["role_needed"] == "editor"
        assert_error(await client.delete(f"{path}/{item_id}", headers=team["eve"]["headers"]), 404, "NotFoundError")
        assert (await client.get(f"{path}/{item_id}", headers=team["dave"]["headers"])).status_code == 200
        if path == SCHEDULE:  # a change needs editor too, and another editor may make it
            change = {"template_id": team_tid, "cron": "0 10 * * *"}
            assert_error(await client.put(f"{path}/{item_id}", headers=team["dave"]["headers"], json=change),
                         403, "PermissionDeniedError")
            crossed = assert_error(await client.put(f"{path}/{item_id}", headers=team["alice"]["headers"],
                                                    json={**change, "template_id": own_tid}), 422, "ValidationError")
            assert crossed["detail"][0]["field"] == "template_id"
            changed = await client.put(f"{path}/{item_id}", headers=team["alice"]["headers"], json=change)
            assert changed.status_code == 200, changed.text
            assert changed.json()["schedule"]["cron"] == "0 10 * * *"
            assert changed.json()["schedule"]["workspace_id"] == wid
        assert (await client.delete(f"{path}/{item_id}", headers=team["alice"]["headers"])).status_code == 200
        assert_error(await client.get(f"{path}/{item_id}", headers=team["bob"]["headers"]), 404, "NotFoundError")


async def test_a_team_schedule_fires_into_its_workspace_while_its_owner_may_run(client, team):
    """A schedule's run belongs to the template's workspace; once its owner may no longer
    run there (demoted to viewer), a due time starts nothing."""
    import datetime as dt

    from orchestra.db.models import WorkflowRun, utcnow
    from orchestra.db.trigger_models import ScheduleFire, WorkflowSchedule

    wid = team["workspace_id"]
    fire_loop = client.app.ctx.process.fires
    await fire_loop.stop()
    tid = (await create(client, team["bob"], workspace_id=wid)).json()["template_id"]
    made = await client.post(SCHEDULE, headers=team["bob"]["headers"],
                             json={"template_id": tid, "cron": "* * * * *", "workspace_id": wid,
                                   "overlap": "allow"})
    sid = made.json()["schedule_id"]
    db = client.app.ctx.core.db

    async def fire(ago: int) -> ScheduleFire:
        due = (utcnow() - dt.timedelta(minutes=ago)).replace(second=0, microsecond=0)
        await db.aexecute(WorkflowSchedule.update(next_due_at=due).where(WorkflowSchedule.id == sid))
        await fire_loop.fire_due(now=due + dt.timedelta(seconds=5))
        return (await db.list(ScheduleFire.select().where((ScheduleFire.schedule == sid)
                                                          & (ScheduleFire.due_at == due))))[0]

    started = await fire(3)
    assert started.outcome == "started", started.error
    run = await WorkflowRun.aget(WorkflowRun.trace_id == started.trace_id)
    assert run.workspace_id == wid and run.owner_id == team["bob"]["user_id"]
    seen = await client.get(f"{WF}/run/{run.trace_id}", headers=team["dave"]["headers"])
    assert seen.status_code == 200 and seen.json()["workspace_id"] == wid
    demoted = await client.put(f"{WS}/{wid}/member/{team['bob']['user_id']}", headers=team["alice"]["headers"],
                               json={"role": "viewer"})
    assert demoted.status_code == 200, demoted.text
    refused = await fire(1)
    assert refused.outcome == "failed" and refused.trace_id is None
    assert await db.count(WorkflowRun.select().where(WorkflowRun.workspace_id == wid)) == 1


async def test_workers_belong_to_a_workspace(client, team):
    """A worker's workspace is the body's (editor there); members read it, editors change
    and delete it, a non-member (an ADMINISTRATOR too) gets 404; lists take ?workspace_id=."""
    wid = team["workspace_id"]
    from orchestra.services import providers

    provider = await providers.create_provider(
        client.app.ctx.core, name="p", kind="openai_compatible", model_id="m", api_key="k",
        base_url="http://127.0.0.1:9/v1")
    body = {"name": "w", "provider_id": provider.id, "workspace_id": wid}
    worker = "/api/v1/agent/worker"
    refused = assert_error(await client.post(worker, headers=team["carol"]["headers"], json=body),
                           403, "PermissionDeniedError")
    assert refused["detail"]["role_needed"] == "editor"
    assert_error(await client.post(worker, headers=team["eve"]["headers"], json=body), 404, "NotFoundError")
    created = await client.post(worker, headers=team["bob"]["headers"], json=body)
    assert created.status_code == 201, created.text
    assert created.json()["workspace_id"] == wid and created.json()["owner_id"] == team["bob"]["user_id"]
    wk = created.json()["worker_id"]
    own = await client.post(worker, headers=team["bob"]["headers"], json={**body, "name": "mine", "workspace_id": None})
    assert own.status_code == 201 and own.json()["workspace_id"] not in (None, wid)
    for who in ("alice", "dave"):
        listed = (await client.get(worker, headers=team[who]["headers"])).json()["workers"]
        assert [w["worker_id"] for w in listed] == [wk]
        assert (await client.get(f"{worker}/{wk}", headers=team[who]["headers"])).status_code == 200
    only = (await client.get(worker, params={"workspace_id": own.json()["workspace_id"]},
                             headers=team["bob"]["headers"])).json()["workers"]
    assert [w["worker_id"] for w in only] == [own.json()["worker_id"]]
    for who in ("eve", "admin"):
        assert_error(await client.get(f"{worker}/{wk}", headers=team[who]["headers"]), 404, "NotFoundError")
        assert_error(await client.put(f"{worker}/{wk}", headers=team[who]["headers"], json={"description": "x"}),
                     404, "NotFoundError")
    assert_error(await client.get(worker, params={"workspace_id": wid}, headers=team["eve"]["headers"]),
                 404, "NotFoundError")
    for who in ("carol", "dave"):
        assert_error(await client.put(f"{worker}/{wk}", headers=team[who]["headers"], json={"description": "x"}),
                     403, "PermissionDeniedError")
        assert_error(await client.delete(f"{worker}/{wk}", headers=team[who]["headers"]), 403, "PermissionDeniedError")
    changed = await client.put(f"{worker}/{wk}", headers=team["alice"]["headers"], json={"description": "x"})
    assert changed.status_code == 200 and changed.json()["description"] == "x"
    assert (await client.delete(f"{worker}/{wk}", headers=team["alice"]["headers"])).status_code == 200
    assert_error(await client.get(f"{worker}/{wk}", headers=team["bob"]["headers"]), 404, "NotFoundError")


async def test_a_blank_workspace_id_is_422_on_every_list(client, team):
    """`?workspace_id=` names no workspace: 422 naming it, never the unfiltered list."""
    for path in (f"{WF}/template", f"{WF}/run", SCHEDULE, HOOK, "/api/v1/agent/worker", "/api/v1/audit",
                 f"{WF}/subscription"):
        for blank in ("", "  "):
            refused = assert_error(await client.get(path, params={"workspace_id": blank},
                                                    headers=team["alice"]["headers"]), 422, "ValidationError")
            assert refused["detail"][0]["field"] == "workspace_id", path
