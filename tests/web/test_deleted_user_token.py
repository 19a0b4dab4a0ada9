"""A deleted user's access token stops working at once on every protected route."""

import pytest

ROUTES = [
    ("GET", "/api/v1/agent/worker", None),
    ("POST", "/api/v1/agent/worker", {"name": "w", "provider_id": "p", "tools": [], "bound_skill": None}),
    (
        "POST",
        "/api/v1/workflow/template",
        {"name": "t", "steps": [{"id": "a", "agent": {"human": True}, "prompt": "p", "depends_on": []}]},
    ),
    ("GET", "/api/v1/workflow/run", None),
    ("GET", "/api/v1/resource/tool", None),
    ("GET", "/api/v1/adapter/client/upload", None),
    ("GET", "/api/v1/provider", None),
]


@pytest.mark.parametrize("method,path,body", ROUTES)
async def test_deleted_users_token_is_refused(client, users, method, path, body):
    admin = await users.make("root", "SUPER_ADMINISTRATOR")
    bob = await users.make("bobby")
    before = await client.request(method, path, json=body, headers=bob["headers"])
    assert before.status_code < 500, before.text
    assert before.status_code != 401
    deleted = await client.delete(f"/api/v1/auth/{bob['user_id']}", headers=admin["headers"])
    assert deleted.status_code == 200
    after = await client.request(method, path, json=body, headers=bob["headers"])
    assert after.status_code == 401, after.text
    assert after.json()["error"] == "TokenInvalidError"
