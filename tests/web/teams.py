"""Two team workspaces and the people around them, for the workspace resource tests
(secrets, providers, MCP servers) that each take `team` from `two_teams`."""

from __future__ import annotations

WS = "/api/v1/workspace"


async def two_teams(client, users) -> dict:
    """alice owns team A where bob is admin and carol editor; bob also owns team B; eve is
    in neither; admin is an instance ADMINISTRATOR, member of neither."""
    people = {name: await users.make(name) for name in ("alice", "bob", "carol", "eve")}
    people["admin"] = await users.make("admin", "ADMINISTRATOR")
    a = (await client.post(WS, headers=people["alice"]["headers"], json={"name": "team-a"})).json()["workspace_id"]
    b = (await client.post(WS, headers=people["bob"]["headers"], json={"name": "team-b"})).json()["workspace_id"]
    for name, role in (("bob", "admin"), ("carol", "editor")):
        added = await client.post(f"{WS}/{a}/member", headers=people["alice"]["headers"],
                                  json={"user_name": name, "role": role})
        assert added.status_code == 201, added.text
    return {"a": a, "b": b, **people}
