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
