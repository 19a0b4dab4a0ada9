"""`/api/v1/resource`: the tool catalog and skill CRUD with its access rules."""

from __future__ import annotations

import pytest

from orchestra.db.models import Skill
from orchestra.engine.tools import default_registry

TOOLS = "/api/v1/resource/tool"
SKILLS = "/api/v1/resource/skill"


async def make_skill(client, admin, **overrides):
    body = {"name": "concise", "description": "Short answers", "instructions": "Answer in one line.", **overrides}
    response = await client.post(SKILLS, json=body, headers=admin["headers"])
    assert response.status_code == 201, response.text
    return response.json()


async def test_tool_catalog_for_any_user(client, user):
    response = await client.get(TOOLS, headers=user["headers"])
    assert response.status_code == 200
    data = response.json()
    assert data["message"] == "success"
    assert data["tools"] == default_registry().catalog()
    names = {t["name"] for t in data["tools"]}
    assert {"calculator", "current_time", "read_upload", "ask_user"} <= names
    for tool in data["tools"]:
        assert set(tool) == {"name", "description", "parameters", "source"}
        assert tool["source"] == "builtin"
        assert tool["parameters"]["type"] == "object"


async def test_tool_catalog_needs_a_token(client):
    response = await client.get(TOOLS)
    assert response.status_code == 401 and response.json()["error"] == "AuthenticationRequiredError"
    response = await client.get(TOOLS, headers={"Authorization": "Bearer nonsense"})
    assert response.status_code == 401 and response.json()["error"] == "TokenInvalidError"


async def test_skill_crud(client, admin, user):
    data = await make_skill(client, admin)
    assert data["message"] == "success" and data["name"] == "concise"
    assert data["instructions"] == "Answer in one line." and data["skill_id"] == data["id"]
    sid = data["skill_id"]
    listed = await client.get(SKILLS, headers=user["headers"])
    assert [s["skill_id"] for s in listed.json()["skills"]] == [sid]
    one = await client.get(f"{SKILLS}/{sid}", headers=user["headers"])
    assert one.status_code == 200 and one.json()["description"] == "Short answers"
    response = await client.put(f"{SKILLS}/{sid}", json={"instructions": "Be brief."}, headers=admin["headers"])
    assert response.status_code == 200 and response.json()["instructions"] == "Be brief."
    assert response.json()["name"] == "concise"
    assert (await Skill.aget(Skill.id == sid)).instructions == "Be brief."
    response = await client.delete(f"{SKILLS}/{sid}", headers=admin["headers"])
    assert response.status_code == 200 and response.json() == {"message": "success"}
    assert await Skill.aget_or_none(Skill.id == sid) is None


async def test_skill_writes_need_an_administrator(client, admin, user):
    response = await client.post(SKILLS, json={"name": "x"}, headers=user["headers"])
    assert response.status_code == 403 and response.json()["error"] == "PermissionDeniedError"
    sid = (await make_skill(client, admin))["skill_id"]
    response = await client.put(f"{SKILLS}/{sid}", json={"name": "y"}, headers=user["headers"])
    assert response.status_code == 403
    response = await client.delete(f"{SKILLS}/{sid}", headers=user["headers"])
    assert response.status_code == 403
    assert (await client.get(SKILLS)).status_code == 401
    assert (await Skill.aget(Skill.id == sid)).name == "concise"


async def test_duplicate_skill_name_is_409(client, admin):
    await make_skill(client, admin)
    response = await client.post(SKILLS, json={"name": "Concise"}, headers=admin["headers"])
    assert response.status_code == 409 and response.json()["error"] == "ConflictError"
    other = await make_skill(client, admin, name="other")
    response = await client.put(f"{SKILLS}/{other['skill_id']}", json={"name": "concise"}, headers=admin["headers"])
    assert response.status_code == 409


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": 1}, "name"),
        ({"name": "ok", "instructions": ["no"]}, "instructions"),
        ({"name": "ok", "description": None}, "description"),
    ],
)
async def test_skill_validation(client, admin, payload, field):
    response = await client.post(SKILLS, json=payload, headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert field in [d["field"] for d in response.json()["detail"]]


async def test_skill_update_validation(client, admin):
    sid = (await make_skill(client, admin))["skill_id"]
    for payload in ({"name": None}, {"instructions": 3}, {"unknown": "x"}):
        response = await client.put(f"{SKILLS}/{sid}", json=payload, headers=admin["headers"])
        assert response.status_code == 422, payload
    response = await client.put(f"{SKILLS}/{sid}", content=b"nope", headers={**admin["headers"], "content-type": "application/json"})
    assert response.status_code == 400


async def test_unknown_skill_is_404(client, admin):
    for method in ("GET", "PUT", "DELETE"):
        response = await client.request(method, f"{SKILLS}/nope", json={"name": "x"}, headers=admin["headers"])
        assert response.status_code == 404 and response.json()["error"] == "NotFoundError", method


async def test_bound_skill_cannot_be_deleted_and_rename_follows(client, admin):
    sid = (await make_skill(client, admin))["skill_id"]
    provider = await client.post(
        "/api/v1/provider", json={"name": "p", "provider": "ollama", "model_id": "llama3"}, headers=admin["headers"]
    )
    worker = await client.post(
        "/api/v1/agent/worker",
        json={"name": "writer", "provider_id": provider.json()["provider_id"], "bound_skill": "concise"},
        headers=admin["headers"],
    )
    assert worker.status_code == 201, worker.text
    response = await client.delete(f"{SKILLS}/{sid}", headers=admin["headers"])
    assert response.status_code == 409
    assert "writer" in response.json()["message"]
    assert response.json()["detail"]["workers"][0]["name"] == "writer"
    response = await client.put(f"{SKILLS}/{sid}", json={"name": "terse"}, headers=admin["headers"])
    assert response.status_code == 200
    wid = worker.json()["worker_id"]
    again = await client.get(f"/api/v1/agent/worker/{wid}", headers=admin["headers"])
    assert again.json()["bound_skill"] == "terse"


async def test_nul_in_path_or_body_is_never_a_500(client, admin):
    for method, path in [("GET", f"{SKILLS}/a%00b"), ("DELETE", f"{SKILLS}/a%00b"), ("GET", "/api/v1/provider/a%00b"),
                         ("GET", "/api/v1/agent/worker/a%00b"), ("GET", "/api/v1/agent/node/a%00b")]:
        response = await client.request(method, path, headers=admin["headers"])
        assert response.status_code == 404, (method, path, response.text)
    response = await client.post(SKILLS, json={"name": "s", "instructions": "a\x00b"}, headers=admin["headers"])
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "instructions"
