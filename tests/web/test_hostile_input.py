"""Input no client should send, on both stores: a clear 4xx, never a 500.

PostgreSQL refuses text with a NUL character, so a NUL anywhere in a JSON body is a
422 naming the field, and a NUL in a path is a 404 — checked once, for every route.
"""

import pytest


@pytest.fixture
def database_url(both_stores):
    return both_stores


NUL_BODIES = [
    ("POST", "/api/v1/workflow/run", {"template_id": "a\u0000b", "input": "x"}, "template_id"),
    ("POST", "/api/v1/workflow/run", {"template_id": "t", "input": "in\u0000put"}, "input"),
    (
        "POST",
        "/api/v1/workflow/template",
        {"name": "t", "steps": [{"id": "s1", "agent": {"worker": "w\u0000"}, "prompt": "p", "depends_on": []}]},
        "steps.0.agent.worker",
    ),
    ("POST", "/api/v1/resource/skill", {"name": "s\u0000", "description": "", "instructions": ""}, "name"),
]


@pytest.mark.parametrize("method,path,body,field", NUL_BODIES)
async def test_nul_in_a_json_body_is_a_422_naming_the_field(client, users, method, path, body, field):
    admin = await users.make("admin", "ADMINISTRATOR")
    response = await client.request(method, path, json=body, headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "ValidationError"
    assert response.json()["detail"] == [{"field": field, "problem": "must not contain the NUL character"}]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/workflow/run/%00",
        "/api/v1/workflow/template/x%00y",
        "/api/v1/agent/worker/%00",
        "/api/v1/provider/%00",
        "/api/v1/adapter/client/upload/%00",
    ],
)
async def test_nul_in_a_path_is_a_404(client, users, path):
    admin = await users.make("admin", "ADMINISTRATOR")
    response = await client.get(path, headers=admin["headers"])
    assert response.status_code == 404, response.text
    assert response.json()["error"] == "NotFoundError"
