"""`/api/v1/resource/mcp` (SPEC §9) against real MCP servers: the SDK-built streamable-HTTP
server on loopback and `mcp-server-time` from PyPI over stdio. Access rules, masked and
encrypted secrets, PUT's full replacement, DELETE's 409, refresh and last_error, the
stdio allow-list, and the tools in the catalog and in workers."""

from __future__ import annotations

import json

import pytest

from orchestra.db.models import McpServer, Worker
from tests.fakes.fake_mcp import FakeMcpProcess

MCP = "/api/v1/resource/mcp"
TOOLS = "/api/v1/resource/tool"
SECRET = "Bearer sk-very-secret-value-9876"


@pytest.fixture
def settings_overrides():
    return {"mcp_stdio_commands": "mcp-server-time"}


async def add_http(client, admin, fake: FakeMcpProcess, **overrides):
    body = {"name": "fake", "transport": "streamable_http", "url": fake.url,
            "headers": {"Authorization": SECRET}, **overrides}
    response = await client.post(MCP, json=body, headers=admin["headers"])
    assert response.status_code == 201, response.text
    return response.json()


async def test_create_read_list_an_http_server_with_its_tools(client, admin, user, fake_mcp):
    data = await add_http(client, admin, fake_mcp, timeout_seconds=12.5)
    assert set(data) == {"message", "server_id", "server"} and data["message"] == "success"
    server = data["server"]
    assert server["server_id"] == data["server_id"] and server["name"] == "fake"
    assert server["transport"] == "streamable_http" and server["url"] == fake_mcp.url
    assert server["headers"] == {"Authorization": "…9876"}
    assert server["timeout_seconds"] == 12.5 and server["last_error"] is None
    tools = {t["name"]: t for t in server["tools"]}
    assert {"fake.echo", "fake.add", "fake.hang", "fake.fail"} <= set(tools)
    assert tools["fake.echo"]["tool"] == "echo"
    assert tools["fake.echo"]["parameters"]["properties"]["text"]["type"] == "string"
    # anyone signed in reads
    one = await client.get(f"{MCP}/{data['server_id']}", headers=user["headers"])
    assert one.status_code == 200 and one.json()["server"] == server
    listed = await client.get(MCP, headers=user["headers"])
    assert listed.status_code == 200 and listed.json()["servers"] == [server]
    # the secret is encrypted at rest: not in any stored column
    row = await McpServer.aget(McpServer.id == data["server_id"])
    stored = json.dumps({k: str(v) for k, v in row.__data__.items()})
    assert "very-secret" not in stored and row.headers_encrypted
    assert json.loads(client.app.ctx.core.secrets.decrypt(row.headers_encrypted)) == {"Authorization": SECRET}


async def test_tools_join_the_catalog_with_their_source(client, admin, user, fake_mcp):
    data = await add_http(client, admin, fake_mcp)
    catalog = (await client.get(TOOLS, headers=user["headers"])).json()["tools"]
    by_name = {t["name"]: t for t in catalog}
    assert by_name["calculator"]["source"] == "builtin"
    echo = by_name["fake.echo"]
    assert echo["source"] == {"mcp": data["server_id"]}
    assert echo["description"] == "Answer the text it is given."
    assert echo["parameters"]["required"] == ["text"]


async def test_workers_choose_mcp_tools_and_unknown_ones_are_422(client, admin, user, fake_mcp):
    await add_http(client, admin, fake_mcp)
    provider = await client.post("/api/v1/provider", headers=admin["headers"], json={
        "name": "p", "provider": "openai_compatible", "model_id": "m", "base_url": "http://127.0.0.1:9"})
    body = {"name": "w", "provider_id": provider.json()["provider_id"], "tools": ["fake.echo", "calculator"]}
    made = await client.post("/api/v1/agent/worker", json=body, headers=user["headers"])
    assert made.status_code == 201, made.text
    assert made.json()["tools"] == ["fake.echo", "calculator"]
    bad = await client.post("/api/v1/agent/worker", headers=user["headers"],
                            json={**body, "name": "w2", "tools": ["fake.nope", "other.echo"]})
    assert bad.status_code == 422 and bad.json()["error"] == "ValidationError"
    fields = [d["field"] for d in bad.json()["detail"]]
    assert fields == ["tools.0", "tools.1"] and "unknown tool 'fake.nope'" in bad.json()["message"]


async def test_changes_need_an_administrator(client, admin, user, fake_mcp):
    data = await add_http(client, admin, fake_mcp)
    sid = data["server_id"]
    body = {"name": "x", "transport": "streamable_http", "url": fake_mcp.url}
    for method, path in (("post", MCP), ("put", f"{MCP}/{sid}"), ("delete", f"{MCP}/{sid}"),
                         ("post", f"{MCP}/{sid}/refresh")):
        kwargs = {"json": body} if method in ("post", "put") and not path.endswith("refresh") else {}
        response = await getattr(client, method)(path, headers=user["headers"], **kwargs)
        assert response.status_code == 403 and response.json()["error"] == "PermissionDeniedError", path
    response = await client.get(MCP)
    assert response.status_code == 401


async def test_put_replaces_and_a_masked_secret_keeps_the_stored_one(client, admin, fake_mcp):
    data = await add_http(client, admin, fake_mcp, headers={"Authorization": SECRET, "X-Other": "other-value-0001"})
    sid, shown = data["server_id"], data["server"]
    body = {"name": "renamed", "transport": "streamable_http", "url": fake_mcp.url,
            "headers": {"Authorization": shown["headers"]["Authorization"], "X-New": "brand-new-value-42"}}
    response = await client.put(f"{MCP}/{sid}", json=body, headers=admin["headers"])
    assert response.status_code == 200, response.text
    server = response.json()["server"]
    assert server["name"] == "renamed" and server["headers"] == {"Authorization": "…9876", "X-New": "…e-42"}
    assert server["timeout_seconds"] == 30  # full replacement: the default again
    row = await McpServer.aget(McpServer.id == sid)
    assert json.loads(client.app.ctx.core.secrets.decrypt(row.headers_encrypted)) == {
        "Authorization": SECRET, "X-New": "brand-new-value-42"}  # X-Other is gone
    # a masked value that is not the stored one's
    body["headers"] = {"Authorization": "…0000"}
    response = await client.put(f"{MCP}/{sid}", json=body, headers=admin["headers"])
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "headers.Authorization"
    assert json.loads(client.app.ctx.core.secrets.decrypt(
        (await McpServer.aget(McpServer.id == sid)).headers_encrypted))["Authorization"] == SECRET


async def test_rename_carries_the_workers_tools_along(client, admin, user, fake_mcp):
    data = await add_http(client, admin, fake_mcp)
    provider = await client.post("/api/v1/provider", headers=admin["headers"], json={
        "name": "p", "provider": "openai_compatible", "model_id": "m", "base_url": "http://127.0.0.1:9"})
    worker = (await client.post("/api/v1/agent/worker", headers=user["headers"], json={
        "name": "w", "provider_id": provider.json()["provider_id"], "tools": ["fake.echo", "calculator"]})).json()
    body = {"name": "tools2", "transport": "streamable_http", "url": fake_mcp.url}
    assert (await client.put(f"{MCP}/{data['server_id']}", json=body, headers=admin["headers"])).status_code == 200
    assert (await Worker.aget(Worker.id == worker["worker_id"])).tools == ["tools2.echo", "calculator"]


async def test_delete_is_409_while_a_worker_uses_its_tools(client, admin, user, fake_mcp):
    data = await add_http(client, admin, fake_mcp)
    provider = await client.post("/api/v1/provider", headers=admin["headers"], json={
        "name": "p", "provider": "openai_compatible", "model_id": "m", "base_url": "http://127.0.0.1:9"})
    worker = (await client.post("/api/v1/agent/worker", headers=user["headers"], json={
        "name": "researcher", "provider_id": provider.json()["provider_id"], "tools": ["fake.add"]})).json()
    response = await client.delete(f"{MCP}/{data['server_id']}", headers=admin["headers"])
    assert response.status_code == 409 and response.json()["error"] == "ConflictError"
    assert "researcher" in response.json()["message"]
    assert response.json()["detail"]["workers"][0]["worker_id"] == worker["worker_id"]
    await client.put(f"/api/v1/agent/worker/{worker['worker_id']}", json={"tools": []}, headers=user["headers"])
    response = await client.delete(f"{MCP}/{data['server_id']}", headers=admin["headers"])
    assert response.status_code == 200 and response.json() == {"message": "success"}
    assert await McpServer.aget_or_none(McpServer.id == data["server_id"]) is None
    catalog = (await client.get(TOOLS, headers=user["headers"])).json()["tools"]
    assert not [t for t in catalog if t["name"].startswith("fake.")]
    assert (await client.get(f"{MCP}/{data['server_id']}", headers=user["headers"])).status_code == 404


async def test_refresh_keeps_the_last_error_and_the_tools(client, admin, fake_mcp):
    data = await add_http(client, admin, fake_mcp, timeout_seconds=3)
    sid = data["server_id"]
    fake_mcp.stop()
    response = await client.post(f"{MCP}/{sid}/refresh", headers=admin["headers"])
    assert response.status_code == 200, response.text
    server = response.json()["server"]
    assert "could not be reached" in server["last_error"]
    assert {t["name"] for t in server["tools"]} == {t["name"] for t in data["server"]["tools"]}
    assert server["refreshed_at"] >= data["server"]["refreshed_at"]
    fake_mcp.start()
    server = (await client.post(f"{MCP}/{sid}/refresh", headers=admin["headers"])).json()["server"]
    assert server["last_error"] is None


async def test_an_unreachable_server_is_saved_with_its_error(client, admin, fake_mcp):
    fake_mcp.stop()
    data = await add_http(client, admin, fake_mcp, timeout_seconds=2)
    assert data["server"]["tools"] == [] and "could not be reached" in data["server"]["last_error"]


async def test_stdio_is_refused_unless_its_command_is_allowed(client, admin):
    body = {"name": "shell", "transport": "stdio", "command": "sh", "args": ["-c", "id"]}
    response = await client.post(MCP, json=body, headers=admin["headers"])
    assert response.status_code == 422 and response.json()["error"] == "ValidationError"
    assert "ORCHESTRA_MCP_STDIO_COMMANDS" in response.json()["message"]
    assert response.json()["detail"][0]["field"] == "command"
    assert await client.app.ctx.core.db.count(McpServer.select()) == 0


async def test_an_allowed_stdio_server_from_pypi_lists_its_tools(client, admin, user):
    body = {"name": "time", "transport": "stdio", "command": "mcp-server-time",
            "args": ["--local-timezone", "UTC"], "env": {"TZ_SECRET": "a-stdio-secret-4321"}}
    response = await client.post(MCP, json=body, headers=admin["headers"])
    assert response.status_code == 201, response.text
    server = response.json()["server"]
    assert server["last_error"] is None and server["env"] == {"TZ_SECRET": "…4321"}
    assert server["command"] == "mcp-server-time" and server["url"] is None
    assert {t["name"] for t in server["tools"]} == {"time.get_current_time", "time.convert_time"}


@pytest.mark.parametrize("body, field", [
    ({"name": "a.b", "transport": "streamable_http", "url": "http://x"}, "name"),
    ({"name": "a", "transport": "sse", "url": "http://x"}, "transport"),
    ({"name": "a", "transport": "streamable_http"}, "url"),
    ({"name": "a", "transport": "streamable_http", "url": "ftp://x"}, "url"),
    ({"name": "a", "transport": "streamable_http", "url": "http://x", "command": "ls"}, "command"),
    ({"name": "a", "transport": "stdio", "command": "mcp-server-time", "url": "http://x"}, "url"),
    ({"name": "a", "transport": "streamable_http", "url": "http://x", "headers": {"Bad Name": "v"}},
     "headers.Bad Name"),
    ({"name": "a", "transport": "streamable_http", "url": "http://x", "headers": {"A": "line\nbreak"}},
     "headers.A"),
    ({"name": "a", "transport": "stdio", "command": "mcp-server-time", "env": {"1X": "v"}}, "env.1X"),
    ({"name": "a", "transport": "streamable_http", "url": "http://x", "timeout_seconds": 0}, "timeout_seconds"),
    ({"name": "a", "transport": "streamable_http", "url": "http://x", "headers": {"A": "…abcd"}}, "headers.A"),
])
async def test_bad_fields_are_422(client, admin, body, field):
    response = await client.post(MCP, json=body, headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "ValidationError"
    assert field in [d["field"] for d in response.json()["detail"]]


async def test_duplicate_names_are_409(client, admin, fake_mcp):
    await add_http(client, admin, fake_mcp)
    response = await client.post(MCP, json={"name": "FAKE", "transport": "streamable_http", "url": fake_mcp.url},
                                 headers=admin["headers"])
    assert response.status_code == 409 and response.json()["error"] == "ConflictError"


async def test_unknown_server_is_404(client, admin):
    for method in ("get", "delete"):
        response = await getattr(client, method)(f"{MCP}/nope", headers=admin["headers"])
        assert response.status_code == 404 and response.json()["error"] == "NotFoundError"
    response = await client.post(f"{MCP}/nope/refresh", headers=admin["headers"])
    assert response.status_code == 404
