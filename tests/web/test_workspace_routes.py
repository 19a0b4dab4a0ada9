"""Workspaces and members (SPEC §16) in process, on SQLite and PostgreSQL: the personal
workspace every user has, team workspaces and their roles, and every refusal's status
and error name."""

from __future__ import annotations

import pytest

from orchestra.db.workspace_models import Workspace, WorkspaceMember

WS = "/api/v1/workspace"


@pytest.fixture
def database_url(both_stores):
    return both_stores


def assert_error(response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and body["message"]
    return body


async def make_team(client, who, name="team", **body) -> dict:
    response = await client.post(WS, headers=who["headers"], json={"name": name, **body})
    assert response.status_code == 201, response.text
    made = response.json()
    assert made["message"] == "success" and made["workspace_id"] == made["workspace"]["workspace_id"]
    return made["workspace"]


async def add(client, who, workspace_id, role, **target):
    return await client.post(f"{WS}/{workspace_id}/member", headers=who["headers"], json={"role": role, **target})


async def test_every_user_has_a_personal_workspace_made_with_them(client, alice):
    response = await client.get(WS, headers=alice["headers"])
    assert response.status_code == 200, response.text
    [mine] = response.json()["workspaces"]
    assert mine["personal"] is True and mine["role"] == "owner" and mine["name"] == "alice"
    assert mine["limits"] == {"monthly_budget_usd": None, "on_budget": "fail"}
    assert mine["created_at"].endswith("Z")
    row = await Workspace.aget(Workspace.id == mine["workspace_id"])
    assert row.personal_user_id == alice["user_id"]


async def test_create_lists_reads_and_shows_the_callers_role(client, alice, users):
    bob = await users.make("bob")
    team = await make_team(client, alice, "Research", limits={"monthly_budget_usd": "12.50"})
    assert team["personal"] is False and team["role"] == "owner" and team["name"] == "Research"
    assert team["limits"] == {"monthly_budget_usd": "12.5", "on_budget": "fail"}
    listed = (await client.get(WS, headers=alice["headers"])).json()["workspaces"]
    assert [w["personal"] for w in listed] == [True, False]
    # bob is not a member: 404, never 403
    assert_error(await client.get(f"{WS}/{team['workspace_id']}", headers=bob["headers"]), 404, "NotFoundError")
    assert (await add(client, alice, team["workspace_id"], "viewer", user_name="bob")).status_code == 201
    seen = await client.get(f"{WS}/{team['workspace_id']}", headers=bob["headers"])
    assert seen.status_code == 200 and seen.json()["workspace"]["role"] == "viewer"
    assert len((await client.get(WS, headers=bob["headers"])).json()["workspaces"]) == 2


async def test_all_is_for_super_administrators_only(client, alice, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    admin = await users.make("admin", "ADMINISTRATOR")
    team = await make_team(client, alice)
    for who in (alice, admin):
        body = assert_error(await client.get(WS, params={"all": "true"}, headers=who["headers"]),
                            403, "PermissionDeniedError")
        assert "SUPER_ADMINISTRATOR" in body["message"]
    every = (await client.get(WS, params={"all": "true"}, headers=root["headers"])).json()["workspaces"]
    ids = {w["workspace_id"] for w in every}
    assert team["workspace_id"] in ids and len(every) == 4  # three personal ones and the team
    assert_error(await client.get(WS, params={"all": "maybe"}, headers=root["headers"]), 422, "ValidationError")
    # a SUPER_ADMINISTRATOR acts in any workspace as its owner
    read = await client.get(f"{WS}/{team['workspace_id']}", headers=root["headers"])
    assert read.status_code == 200 and read.json()["workspace"]["role"] == "owner"
    assert (await add(client, root, team["workspace_id"], "owner", user_id=admin["user_id"])).status_code == 201
    # an instance ADMINISTRATOR is nothing inside a workspace it is not a member of
    other = await make_team(client, alice, "other")
    assert_error(await client.get(f"{WS}/{other['workspace_id']}", headers=admin["headers"]), 404, "NotFoundError")


async def test_limits_are_validated_naming_the_field(client, alice):
    for limits, field in (({"monthly_budget_usd": -1}, "limits.monthly_budget_usd"),
                          ({"monthly_budget_usd": "lots"}, "limits.monthly_budget_usd"),
                          ({"on_budget": "explode"}, "limits.on_budget"),
                          ({"extra": 1}, "limits.extra")):
        body = assert_error(await client.post(WS, headers=alice["headers"], json={"name": "t", "limits": limits}),
                            422, "ValidationError")
        assert body["detail"][0]["field"] == field, body
    team = await make_team(client, alice)
    url = f"{WS}/{team['workspace_id']}"
    body = assert_error(await client.put(url, headers=alice["headers"],
                                         json={"limits": {"monthly_budget_usd": -5}}), 422, "ValidationError")
    assert body["detail"][0]["field"] == "limits.monthly_budget_usd"
    changed = await client.put(url, headers=alice["headers"],
                               json={"limits": {"monthly_budget_usd": 0, "on_budget": "pause"}})
    assert changed.status_code == 200, changed.text
    assert changed.json()["workspace"]["limits"] == {"monthly_budget_usd": "0", "on_budget": "pause"}
    renamed = await client.put(url, headers=alice["headers"], json={"name": "Renamed"})
    workspace = renamed.json()["workspace"]
    assert workspace["name"] == "Renamed" and workspace["limits"]["on_budget"] == "pause"  # only what was sent


async def test_roles_decide_and_a_403_names_the_least_role(client, alice, users):
    bob, carol = await users.make("bob"), await users.make("carol")
    team = await make_team(client, alice)
    url = f"{WS}/{team['workspace_id']}"
    assert (await add(client, alice, team["workspace_id"], "editor", user_name="BOB")).status_code == 201
    body = assert_error(await client.put(url, headers=bob["headers"], json={"name": "x"}), 403, "PermissionDeniedError")
    assert "'admin'" in body["message"] and body["detail"]["role_needed"] == "admin"
    body = assert_error(await add(client, bob, team["workspace_id"], "viewer", user_name="carol"),
                        403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "admin"
    # an admin manages members below owner, never owner itself
    assert (await client.put(f"{url}/member/{bob['user_id']}", headers=alice["headers"],
                             json={"role": "admin"})).status_code == 200
    assert (await add(client, bob, team["workspace_id"], "runner", user_name="carol")).status_code == 201
    body = assert_error(await client.put(f"{url}/member/{carol['user_id']}", headers=bob["headers"],
                                         json={"role": "owner"}), 403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "owner"
    body = assert_error(await client.delete(f"{url}/member/{alice['user_id']}", headers=bob["headers"]),
                        403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "owner"
    body = assert_error(await client.delete(url, headers=bob["headers"]), 403, "PermissionDeniedError")
    assert body["detail"]["role_needed"] == "owner"
    members = (await client.get(f"{url}/member", headers=carol["headers"])).json()["members"]
    assert members == [
        {"user_id": alice["user_id"], "user_name": "alice", "role": "owner"},
        {"user_id": bob["user_id"], "user_name": "bob", "role": "admin"},
        {"user_id": carol["user_id"], "user_name": "carol", "role": "runner"},
    ]
    # any member may leave
    left = await client.delete(f"{url}/member/{carol['user_id']}", headers=carol["headers"])
    assert left.status_code == 200 and left.json()["member"]["role"] == "runner"
    assert_error(await client.get(url, headers=carol["headers"]), 404, "NotFoundError")


async def test_member_rules_unknown_users_duplicates_and_bad_roles(client, alice, users):
    bob = await users.make("bob")
    team = await make_team(client, alice)
    wid = team["workspace_id"]
    assert_error(await add(client, alice, wid, "viewer", user_name="nobody"), 404, "UserNotExistError")
    assert_error(await add(client, alice, wid, "viewer", user_id="00000000-0000-0000-0000-000000000000"),
                 404, "UserNotExistError")
    body = assert_error(await add(client, alice, wid, "Viewer", user_name="bob"), 422, "ValidationError")
    assert body["detail"][0]["field"] == "role"
    assert_error(await add(client, alice, wid, "viewer"), 422, "ValidationError")
    made = await add(client, alice, wid, "viewer", user_name="bob")
    assert made.status_code == 201
    assert made.json()["member"] == {"user_id": bob["user_id"], "user_name": "bob", "role": "viewer"}
    assert_error(await add(client, alice, wid, "runner", user_id=bob["user_id"]), 409, "ConflictError")
    assert_error(await client.put(f"{WS}/{wid}/member/{alice['user_id']}x", headers=alice["headers"],
                                  json={"role": "viewer"}), 404, "NotFoundError")
    # a workspace that does not exist, or a non-member asking, is 404
    assert_error(await add(client, alice, "no-such-workspace", "viewer", user_name="bob"), 404, "NotFoundError")


async def test_the_last_owner_can_neither_leave_nor_be_demoted(client, alice, users):
    bob = await users.make("bob")
    team = await make_team(client, alice)
    url = f"{WS}/{team['workspace_id']}/member"
    assert_error(await client.put(f"{url}/{alice['user_id']}", headers=alice["headers"], json={"role": "admin"}),
                 409, "ConflictError")
    assert_error(await client.delete(f"{url}/{alice['user_id']}", headers=alice["headers"]), 409, "ConflictError")
    assert (await add(client, alice, team["workspace_id"], "owner", user_name="bob")).status_code == 201
    demoted = await client.put(f"{url}/{alice['user_id']}", headers=bob["headers"], json={"role": "editor"})
    assert demoted.status_code == 200 and demoted.json()["member"]["role"] == "editor"
    assert_error(await client.delete(f"{url}/{bob['user_id']}", headers=bob["headers"]), 409, "ConflictError")
    row = await WorkspaceMember.aget((WorkspaceMember.workspace == team["workspace_id"])
                                     & (WorkspaceMember.user == bob["user_id"]))
    assert row.role == "owner"


async def test_a_personal_workspace_is_never_shared_nor_deleted(client, alice, users):
    await users.make("bob")
    [mine] = (await client.get(WS, headers=alice["headers"])).json()["workspaces"]
    url = f"{WS}/{mine['workspace_id']}"
    assert_error(await add(client, alice, mine["workspace_id"], "viewer", user_name="bob"), 409, "ConflictError")
    assert_error(await client.delete(url, headers=alice["headers"]), 409, "ConflictError")
    assert (await client.get(url, headers=alice["headers"])).status_code == 200


async def test_delete_removes_a_team_workspace_and_its_memberships(client, alice, users):
    bob = await users.make("bob")
    team = await make_team(client, alice)
    await add(client, alice, team["workspace_id"], "admin", user_name="bob")
    gone = await client.delete(f"{WS}/{team['workspace_id']}", headers=alice["headers"])
    assert gone.status_code == 200, gone.text
    assert gone.json()["workspace_id"] == team["workspace_id"]
    assert_error(await client.get(f"{WS}/{team['workspace_id']}", headers=bob["headers"]), 404, "NotFoundError")
    assert not await client.app.ctx.core.db.exists(
        WorkspaceMember.select().where(WorkspaceMember.workspace == team["workspace_id"]))


AUDIT = "/api/v1/audit"


async def test_workspace_and_member_changes_are_audited_and_read_by_its_admins(client, alice, users):
    """workspace.create|update|delete and member.add|update|remove are entries of the
    workspace's chain; its owners and admins read it (?workspace_id=), others do not; a
    refused change writes nothing."""
    from orchestra.db.audit_models import AuditEntry

    bob, carol, eve = [await users.make(n) for n in ("bob", "carol", "eve")]
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    team = await make_team(client, alice, "Support")
    wid = team["workspace_id"]
    assert (await add(client, alice, wid, "admin", user_name="bob")).status_code == 201
    assert (await add(client, bob, wid, "viewer", user_name="carol")).status_code == 201
    changed = await client.put(f"{WS}/{wid}/member/{carol['user_id']}", headers=bob["headers"], json={"role": "runner"})
    assert changed.status_code == 200, changed.text
    renamed = await client.put(f"{WS}/{wid}", headers=bob["headers"],
                               json={"name": "Help", "limits": {"monthly_budget_usd": "5"}})
    assert renamed.status_code == 200, renamed.text
    # refused changes write nothing
    before = await client.app.ctx.core.db.count(AuditEntry.select())
    assert_error(await add(client, carol, wid, "viewer", user_name="eve"), 403, "PermissionDeniedError")
    assert_error(await add(client, alice, wid, "viewer", user_name="bob"), 409, "ConflictError")
    assert_error(await client.put(f"{WS}/{wid}/member/{alice['user_id']}", headers=alice["headers"],
                                  json={"role": "admin"}), 409, "ConflictError")
    assert await client.app.ctx.core.db.count(AuditEntry.select()) == before
    assert (await client.delete(f"{WS}/{wid}/member/{carol['user_id']}", headers=bob["headers"])).status_code == 200
    # the workspace's admin reads its chain, oldest last
    read = await client.get(AUDIT, headers=bob["headers"], params={"workspace_id": wid})
    assert read.status_code == 200, read.text
    entries = read.json()["entries"]
    assert [e["action"] for e in reversed(entries)] == [
        "workspace.create", "member.add", "member.add", "member.update", "workspace.update", "member.remove"]
    assert {e["workspace_id"] for e in entries} == {wid}
    by = {e["action"]: e for e in reversed(entries)}
    assert by["workspace.create"]["actor"]["user_id"] == alice["user_id"]
    assert by["workspace.create"]["target"] == {"type": "workspace", "id": wid, "name": "Support"}
    assert by["member.update"]["target"] == {"type": "member", "id": carol["user_id"], "name": "carol"}
    assert by["member.update"]["changes"] == {"role": {"from": "viewer", "to": "runner"}}
    assert by["member.update"]["actor"]["user_id"] == bob["user_id"]
    assert by["member.remove"]["changes"] == {"role": {"from": "runner", "to": None}}
    assert by["workspace.update"]["changes"] == {
        "limits": {"from": None, "to": {"monthly_budget_usd": "5", "on_budget": "fail"}},
        "name": {"from": "Support", "to": "Help"}}
    chain = list(reversed(entries))
    assert [e["seq"] for e in chain] == list(range(chain[0]["seq"], chain[0]["seq"] + len(chain)))
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(chain, chain[1:], strict=False))
    # filters work inside the chain; the unfiltered view holds it, never instance entries
    only = (await client.get(AUDIT, headers=bob["headers"],
                             params={"workspace_id": wid, "action": "member.add"})).json()["entries"]
    assert len(only) == 2
    unfiltered = (await client.get(AUDIT, headers=bob["headers"])).json()["entries"]
    assert {e["audit_id"] for e in entries} <= {e["audit_id"] for e in unfiltered}
    assert all(e["workspace_id"] is not None for e in unfiltered)
    # below admin: 403 naming admin; not a member: 404; a carol re-added as runner: 403
    assert (await add(client, alice, wid, "runner", user_name="carol")).status_code == 201
    refused = assert_error(await client.get(AUDIT, headers=carol["headers"], params={"workspace_id": wid}),
                           403, "PermissionDeniedError")
    assert refused["detail"]["role_needed"] == "admin"
    assert wid not in {e["workspace_id"] for e in
                       (await client.get(AUDIT, headers=carol["headers"])).json()["entries"]}
    assert_error(await client.get(AUDIT, headers=eve["headers"], params={"workspace_id": wid}), 404, "NotFoundError")
    # the owner deletes it: the entry stays in its chain, read by a SUPER_ADMINISTRATOR
    assert (await client.delete(f"{WS}/{wid}", headers=alice["headers"])).status_code == 200
    assert_error(await client.get(AUDIT, headers=alice["headers"], params={"workspace_id": wid}), 404, "NotFoundError")
    kept = (await client.get(AUDIT, headers=root["headers"], params={"workspace_id": wid})).json()["entries"]
    assert kept[0]["action"] == "workspace.delete" and kept[0]["actor"]["user_id"] == alice["user_id"]
    assert kept[0]["changes"]["name"] == {"from": "Help", "to": None}
    assert len(kept) == len(entries) + 2  # carol's second add, then the delete
    # a SUPER_ADMINISTRATOR naming a workspace that has no chain, or no workspace: 404
    for unknown in ("00000000-0000-4000-8000-000000000000", "null"):
        assert_error(await client.get(AUDIT, headers=root["headers"], params={"workspace_id": unknown}),
                     404, "NotFoundError")
