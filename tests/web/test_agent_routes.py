"""`/api/v1/agent`: workers (owner only), system nodes and the cache reload."""

from __future__ import annotations

import pytest

from orchestra.db.models import SystemNode, Worker

WORKERS = "/api/v1/agent/worker"
NODES = "/api/v1/agent/node"



@pytest.fixture
async def bob(users):
    return await users.make("bob", "USER")


@pytest.fixture
async def provider_id(client, admin):
    response = await client.post(
        "/api/v1/provider",
        json={"name": "main", "provider": "openai", "model_id": "gpt-4o-mini", "api_key": "sk-secret-key-0001"},
        headers=admin["headers"],
    )
    assert response.status_code == 201, response.text
    return response.json()["provider_id"]


@pytest.fixture
async def skill(client, admin):
    response = await client.post(
        "/api/v1/resource/skill", json={"name": "concise", "instructions": "Be brief."}, headers=admin["headers"]
    )
    assert response.status_code == 201
    return response.json()


async def make_worker(client, who, provider_id, **overrides):
    body = {"name": "writer", "provider_id": provider_id, "tools": ["calculator"], "bound_skill": None, **overrides}
    response = await client.post(WORKERS, json=body, headers=who["headers"])
    assert response.status_code == 201, response.text
    return response.json()


async def test_create_worker_and_read_it_back(client, alice, provider_id, skill):
    data = await make_worker(
        client, alice, provider_id, description="Writes", system_prompt="You write.",
        model="gpt-4o", tools=["calculator", "current_time"], bound_skill="concise",
    )
    assert data["message"] == "success" and data["worker_id"] == data["id"]
    assert data["owner_id"] == alice["user_id"] and data["provider_id"] == provider_id
    assert data["provider_name"] == "main" and data["model"] == "gpt-4o"
    assert data["tools"] == ["calculator", "current_time"] and data["bound_skill"] == "concise"
    row = await Worker.aget(Worker.id == data["worker_id"])
    assert row.tools == ["calculator", "current_time"] and row.owner_id == alice["user_id"]
    got = await client.get(f"{WORKERS}/{data['worker_id']}", headers=alice["headers"])
    assert got.status_code == 200 and got.json()["system_prompt"] == "You write."


async def test_unknown_tools_skill_and_provider_are_422_naming_them(client, alice, provider_id):
    response = await client.post(
        WORKERS,
        json={"name": "w", "provider_id": "no-such-provider", "tools": ["calculator", "teleport", "fly"], "bound_skill": "ghost"},
        headers=alice["headers"],
    )
    assert response.status_code == 422
    data = response.json()
    assert data["error"] == "ValidationError"
    problems = " ".join(d["problem"] for d in data["detail"])
    for name in ("teleport", "fly", "ghost", "no-such-provider"):
        assert name in problems and name in data["message"]
    assert "calculator'" not in problems
    assert {d["field"] for d in data["detail"]} == {"provider_id", "tools.1", "tools.2", "bound_skill"}
    assert await client.app.ctx.core.db.count(Worker.select()) == 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tools": "calculator"}, "tools"),
        ({"tools": [1]}, "tools.0"),
        ({"name": ""}, "name"),
        ({"name": None}, "name"),
        ({"model": 4}, "model"),
        ({"bound_skill": 1}, "bound_skill"),
        ({"provider_id": None}, "provider_id"),
    ],
)
async def test_worker_body_validation(client, alice, provider_id, overrides, field):
    body = {"name": "w", "provider_id": provider_id, "tools": [], **overrides}
    response = await client.post(WORKERS, json=body, headers=alice["headers"])
    assert response.status_code == 422, response.text
    assert field in [d["field"] for d in response.json()["detail"]]


async def test_workers_are_private_to_their_owner(client, alice, bob, admin, provider_id):
    mine = await make_worker(client, alice, provider_id)
    wid = mine["worker_id"]
    listed = await client.get(WORKERS, headers=alice["headers"])
    assert [w["worker_id"] for w in listed.json()["workers"]] == [wid]
    assert (await client.get(WORKERS, headers=bob["headers"])).json()["workers"] == []
    assert (await client.get(WORKERS, headers=admin["headers"])).json()["workers"] == []
    for method in ("GET", "PUT", "DELETE"):
        response = await client.request(method, f"{WORKERS}/{wid}", json={"name": "stolen"}, headers=bob["headers"])
        assert response.status_code == 404 and response.json()["error"] == "NotFoundError", method
    assert (await Worker.aget(Worker.id == wid)).name == "writer"
    assert (await client.get(WORKERS)).status_code == 401
    assert (await client.post(WORKERS, json={})).status_code == 401


async def test_update_and_delete_worker(client, alice, provider_id, skill):
    wid = (await make_worker(client, alice, provider_id, model="m1"))["worker_id"]
    response = await client.put(
        f"{WORKERS}/{wid}", json={"name": "editor", "tools": ["read_upload"], "bound_skill": "concise", "model": None},
        headers=alice["headers"],
    )
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["name"] == "editor" and data["tools"] == ["read_upload"]
    assert data["bound_skill"] == "concise" and data["model"] is None
    response = await client.put(f"{WORKERS}/{wid}", json={"bound_skill": None}, headers=alice["headers"])
    assert response.json()["bound_skill"] is None and response.json()["name"] == "editor"
    for payload in ({"tools": ["nope"]}, {"provider_id": "nope"}, {"owner_id": "x"}, {"name": None}, {"tools": None}):
        response = await client.put(f"{WORKERS}/{wid}", json=payload, headers=alice["headers"])
        assert response.status_code == 422, payload
    assert (await Worker.aget(Worker.id == wid)).tools == ["read_upload"]
    response = await client.delete(f"{WORKERS}/{wid}", headers=alice["headers"])
    assert response.status_code == 200 and response.json() == {"message": "success"}
    assert (await client.get(f"{WORKERS}/{wid}", headers=alice["headers"])).status_code == 404


async def test_unknown_worker_is_404(client, alice):
    for method in ("GET", "PUT", "DELETE"):
        response = await client.request(method, f"{WORKERS}/nope", json={"name": "x"}, headers=alice["headers"])
        assert response.status_code == 404, method


async def test_nodes_list_and_set(client, admin, alice, provider_id):
    response = await client.get(NODES, headers=alice["headers"])
    assert response.status_code == 200
    nodes = response.json()["nodes"]
    assert [n["name"] for n in nodes] == ["planner", "reviewer", "summarizer"]
    assert {n["name"]: n["tools"] for n in nodes} == {
        "planner": ["current_time"], "reviewer": ["calculator"], "summarizer": ["read_upload"],
    }
    assert all(n["provider"] is None and n["model"] is None for n in nodes)
    response = await client.put(f"{NODES}/reviewer", json={"provider": provider_id, "model": "gpt-4o"}, headers=admin["headers"])
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["provider"] == provider_id and data["model"] == "gpt-4o" and data["tools"] == ["calculator"]
    row = await SystemNode.aget(SystemNode.name == "reviewer")
    assert row.provider_id == provider_id and row.model == "gpt-4o"
    response = await client.put(f"{NODES}/reviewer", json={"model": None}, headers=admin["headers"])
    assert response.json()["model"] is None and response.json()["provider"] == provider_id
    listed = {n["name"]: n for n in (await client.get(NODES, headers=alice["headers"])).json()["nodes"]}
    assert listed["reviewer"]["provider_name"] == "main"


async def test_node_put_rules(client, admin, alice, provider_id):
    response = await client.put(f"{NODES}/planner", json={"provider": provider_id}, headers=alice["headers"])
    assert response.status_code == 403 and response.json()["error"] == "PermissionDeniedError"
    response = await client.put(f"{NODES}/planner", json={"provider": provider_id, "tools": ["ask_user"]}, headers=admin["headers"])
    assert response.status_code == 422 and "tools" in [d["field"] for d in response.json()["detail"]]
    response = await client.put(f"{NODES}/planner", json={"provider": "no-such"}, headers=admin["headers"])
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "provider"
    response = await client.put(f"{NODES}/planner", json={"model": 7}, headers=admin["headers"])
    assert response.status_code == 422
    response = await client.put(f"{NODES}/planner", json={}, headers=admin["headers"])
    assert response.status_code == 422
    response = await client.put(f"{NODES}/janitor", json={"model": "x"}, headers=admin["headers"])
    assert response.status_code == 404 and response.json()["error"] == "NotFoundError"
    assert (await client.get(f"{NODES}/janitor", headers=alice["headers"])).status_code == 404
    assert (await client.get(NODES)).status_code == 401
    assert await SystemNode.aget_or_none(SystemNode.name == "planner") is None


async def test_reload_counts_and_access(client, admin, alice, provider_id):
    await make_worker(client, alice, provider_id)
    await make_worker(client, admin, provider_id, name="second")
    response = await client.post("/api/v1/agent/reload", headers=alice["headers"])
    assert response.status_code == 403
    assert (await client.post("/api/v1/agent/reload")).status_code == 401
    response = await client.post("/api/v1/agent/reload", headers=admin["headers"])
    assert response.status_code == 200
    assert response.json() == {"message": "success", "workers": 2, "nodes": 3}


async def test_cache_sees_route_writes(client, admin, alice, provider_id):
    cache = client.app.ctx.core.agent_cache
    wid = (await make_worker(client, alice, provider_id))["worker_id"]
    config = await cache.worker(wid)
    assert config.name == "writer" and config.provider_api_key == "sk-secret-key-0001"
    await client.put(f"{WORKERS}/{wid}", json={"name": "renamed"}, headers=alice["headers"])
    assert (await cache.worker(wid)).name == "renamed"
    await client.put(f"{NODES}/planner", json={"provider": provider_id}, headers=admin["headers"])
    assert (await cache.node("planner")).model == "gpt-4o-mini"
    await client.delete(f"{WORKERS}/{wid}", headers=alice["headers"])
    assert await cache.worker(wid) is None


async def test_super_administrator_manages_shared_resources_and_openapi_lists_routes(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    response = await client.post(
        "/api/v1/provider", json={"name": "p", "provider": "ollama", "model_id": "llama3"}, headers=root["headers"]
    )
    assert response.status_code == 201
    response = await client.put(f"{NODES}/summarizer", json={"provider": response.json()["provider_id"]}, headers=root["headers"])
    assert response.status_code == 200
    assert (await client.post("/api/v1/agent/reload", headers=root["headers"])).json()["nodes"] == 3
    spec = await client.get("/api/v1/docs/openapi.json")
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    for path in ("/api/v1/provider", "/api/v1/provider/{provider_id}/check", "/api/v1/agent/worker",
                 "/api/v1/agent/node/{name}", "/api/v1/agent/reload", "/api/v1/resource/tool",
                 "/api/v1/resource/skill/{skill_id}"):
        assert path in paths, path
