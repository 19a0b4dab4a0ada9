"""A masked secret goes only where it was entered for (SPEC §15, issue 23 finding 5): a
provider's new base_url, an MCP server's new url or command, with the stored secret
kept (not sent, or sent back masked) → 422 naming api_key / headers / env, and nothing
changes; the new host never sees the key. Unchanged destinations keep the secret."""

from __future__ import annotations

import pytest

from orchestra.db.models import McpServer, Provider
from orchestra.services import providers as provider_service
from tests.fakes.fake_llm import FakeLLM

PROVIDER = "/api/v1/provider"
MCP = "/api/v1/resource/mcp"
KEY = "sk-the-real-key-0042"


@pytest.fixture
def settings_overrides():
    return {"mcp_stdio_commands": "mcp-server-time,python3"}


async def test_a_new_base_url_needs_the_key_again(client, admin, fake_llm):
    with FakeLLM() as elsewhere:
        body = {"name": "p", "provider": "openai_compatible", "model_id": "m", "base_url": fake_llm.base_url,
                "api_key": KEY}
        created = (await client.post(PROVIDER, json=body, headers=admin["headers"])).json()
        pid, masked = created["provider_id"], created["api_key"]
        assert masked == "sk-…0042"
        for change in ({"base_url": elsewhere.base_url}, {"base_url": elsewhere.base_url, "api_key": masked}):
            response = await client.put(f"{PROVIDER}/{pid}", json=change, headers=admin["headers"])
            assert response.status_code == 422, response.text
            assert response.json()["detail"][0]["field"] == "api_key"
        stored = await Provider.aget(Provider.id == pid)
        assert stored.base_url == fake_llm.base_url
        check = await client.post(f"{PROVIDER}/{pid}/check", headers=admin["headers"])
        assert check.json()["ok"] is True
        assert not any(KEY in str(r.headers) for r in elsewhere.requests)  # never sent elsewhere

        # the masked key sent back with the same base_url keeps it
        response = await client.put(f"{PROVIDER}/{pid}", json={"api_key": masked, "name": "q"},
                                    headers=admin["headers"])
        assert response.status_code == 200 and response.json()["api_key"] == masked
        core = client.app.ctx.core
        assert provider_service.decrypt_api_key(core, await Provider.aget(Provider.id == pid)) == KEY
        # the key entered again (or removed) with the new base_url is accepted
        response = await client.put(f"{PROVIDER}/{pid}", json={"base_url": elsewhere.base_url, "api_key": KEY},
                                    headers=admin["headers"])
        assert response.status_code == 200 and response.json()["base_url"] == elsewhere.base_url
        response = await client.put(f"{PROVIDER}/{pid}", json={"base_url": fake_llm.base_url, "api_key": None},
                                    headers=admin["headers"])
        assert response.status_code == 200 and response.json()["has_api_key"] is False


async def test_a_provider_without_a_key_may_move(client, admin, fake_llm):
    body = {"name": "p", "provider": "openai_compatible", "model_id": "m", "base_url": fake_llm.base_url}
    pid = (await client.post(PROVIDER, json=body, headers=admin["headers"])).json()["provider_id"]
    response = await client.put(f"{PROVIDER}/{pid}", json={"base_url": "http://127.0.0.1:9/v1"},
                                headers=admin["headers"])
    assert response.status_code == 200, response.text


async def test_a_new_mcp_url_needs_the_headers_again(client, admin, fake_mcp):
    secret = "Bearer sk-mcp-secret-7777"
    body = {"name": "m", "transport": "streamable_http", "url": fake_mcp.url, "headers": {"Authorization": secret}}
    created = (await client.post(MCP, json=body, headers=admin["headers"])).json()
    sid, masked = created["server_id"], created["server"]["headers"]["Authorization"]
    moved = {**body, "url": fake_mcp.url.replace("127.0.0.1", "localhost"), "headers": {"Authorization": masked}}
    response = await client.put(f"{MCP}/{sid}", json=moved, headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == "headers.Authorization"
    assert (await McpServer.aget(McpServer.id == sid)).url == fake_mcp.url
    same = {**body, "headers": {"Authorization": masked}, "timeout_seconds": 9}
    response = await client.put(f"{MCP}/{sid}", json=same, headers=admin["headers"])
    assert response.status_code == 200 and response.json()["server"]["headers"] == {"Authorization": masked}
    response = await client.put(f"{MCP}/{sid}", json={**moved, "headers": {"Authorization": secret}},
                                headers=admin["headers"])
    assert response.status_code == 200, response.text


async def test_a_new_stdio_command_needs_the_env_again(client, admin):
    body = {"name": "t", "transport": "stdio", "command": "mcp-server-time", "args": ["--local-timezone", "UTC"],
            "env": {"TIME_TOKEN": "a-stdio-secret-4321"}}
    created = (await client.post(MCP, json=body, headers=admin["headers"])).json()
    sid = created["server_id"]
    masked = created["server"]["env"]["TIME_TOKEN"]
    moved = {**body, "command": "python3", "env": {"TIME_TOKEN": masked}}
    response = await client.put(f"{MCP}/{sid}", json=moved, headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == "env.TIME_TOKEN"
    assert (await McpServer.aget(McpServer.id == sid)).command == "mcp-server-time"
    response = await client.put(f"{MCP}/{sid}", json={**body, "env": {"TIME_TOKEN": masked}},
                                headers=admin["headers"])
    assert response.status_code == 200 and response.json()["server"]["env"] == {"TIME_TOKEN": masked}
