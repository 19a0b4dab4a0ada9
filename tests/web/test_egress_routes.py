"""The egress rule (SPEC §14) on provider and MCP URLs, through the API, against real
loopback servers: refused at save (422 naming the field and ORCHESTRA_EGRESS_ALLOW) and
at check / refresh (ok: false, last_error) for every class of internal address and odd
spelling; allowed when listed (an address, an address with its port); a redirect to an
address that is not allowed is refused; a check never echoes what a server answered."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from orchestra.db.models import McpServer, Provider
from orchestra.services import mcp as mcp_service
from orchestra.services import providers as provider_service

PROVIDER = "/api/v1/provider"
MCP = "/api/v1/resource/mcp"
SETTING = "ORCHESTRA_EGRESS_ALLOW"

# Internal addresses, and names or spellings that resolve to one.
REFUSED = [
    "http://127.0.0.1:9/v1", "http://[::1]:9/v1", "http://10.0.0.1/v1", "http://169.254.169.254/v1",
    "http://localhost:9/v1", "http://127.1:9/v1", "http://2130706433:9/v1", "http://[::ffff:127.0.0.1]:9/v1",
    "http://0x7f.1:9/v1", "http://192.168.1.1/v1", "http://100.64.0.1/v1", "http://[fd00::1]/v1", "http://0.0.0.0:9/v1",
]


@pytest.fixture
def settings_overrides():
    return {"egress_allow": ""}  # the default: public addresses only


def strict(core, allow: str = ""):
    """The same store under another ORCHESTRA_EGRESS_ALLOW."""
    return dataclasses.replace(core, settings=dataclasses.replace(core.settings, egress_allow=allow))


@pytest.mark.parametrize("url", REFUSED)
async def test_an_internal_base_url_is_refused_at_save(client, admin, url):
    body = {"name": "p", "provider": "openai_compatible", "model_id": "m", "base_url": url}
    response = await client.post(PROVIDER, json=body, headers=admin["headers"])
    assert response.status_code == 422, response.text
    data = response.json()
    assert data["detail"][0]["field"] == "base_url" and data["detail"][0]["setting"] == SETTING
    assert "egress rule" in data["message"] and SETTING in data["message"]
    assert await client.app.ctx.core.db.count(Provider.select()) == 0


@pytest.mark.parametrize("url", REFUSED[:8])
async def test_an_internal_mcp_url_is_refused_at_save(client, admin, url):
    body = {"name": "m", "transport": "streamable_http", "url": url.replace("/v1", "/mcp")}
    response = await client.post(MCP, json=body, headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == "url" and SETTING in response.json()["message"]
    assert await client.app.ctx.core.db.count(McpServer.select()) == 0


async def test_the_default_url_of_a_kind_is_checked_too(client, admin):
    body = {"name": "local", "provider": "ollama", "model_id": "llama3"}  # http://127.0.0.1:11434/v1
    response = await client.post(PROVIDER, json=body, headers=admin["headers"])
    assert response.status_code == 422 and "127.0.0.1:11434" in response.json()["message"]


@pytest.mark.parametrize("url", REFUSED)
async def test_a_stored_internal_base_url_is_refused_at_check(client, admin, url):
    """A URL stored while the operator allowed it (or before the rule): the check does
    not connect, and says why in a sentence naming the rule and the setting."""
    provider = await Provider.acreate(name="p", kind="openai_compatible", model_id="m", base_url=url)
    response = await client.post(f"{PROVIDER}/{provider.id}/check", headers=admin["headers"])
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["ok"] is False and "egress rule" in data["error"] and SETTING in data["error"]


def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


async def test_check_connects_when_the_address_and_port_are_listed(client, admin, fake_llm):
    core = client.app.ctx.core
    port = port_of(fake_llm.base_url)
    provider = await Provider.acreate(name="p", kind="openai_compatible", model_id="m", base_url=fake_llm.base_url)
    refused = await provider_service.check_provider(core, provider_id=provider.id)
    assert refused["ok"] is False and fake_llm.requests == []  # never reached
    other_port = strict(core, f"127.0.0.1:{port + 1}")
    assert (await provider_service.check_provider(other_port, provider_id=provider.id))["ok"] is False
    for allow in (f"127.0.0.1:{port}", "127.0.0.1", "127.0.0.0/8", "localhost"):
        if allow == "localhost":  # a host name entry allows that name only
            await Provider.update(base_url=fake_llm.base_url.replace("127.0.0.1", "localhost")).where(
                Provider.id == provider.id).aexecute()
        answer = await provider_service.check_provider(strict(core, allow), provider_id=provider.id)
        assert answer == {"ok": True, "models": sorted(fake_llm.models)}, allow


async def test_save_is_allowed_when_listed(client, admin, fake_llm):
    core = client.app.ctx.core
    created = await provider_service.create_provider(
        strict(core, f"127.0.0.1:{port_of(fake_llm.base_url)}"), name="p", kind="openai_compatible", model_id="m",
        base_url=fake_llm.base_url)
    assert created.base_url == fake_llm.base_url


async def _internal_service(body: bytes, status: str = "200 OK") -> asyncio.Server:
    """An 'internal' HTTP service on loopback that answers every request with `body`."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


@pytest.mark.parametrize("status", ["200 OK", "500 Internal Server Error", "401 Unauthorized"])
async def test_check_never_echoes_what_the_server_answered(client, admin, status):
    secret = b'{"error": {"message": "root:x:0:0 internal-secret-4711"}, "data": "internal-secret-4711"}'
    server = await _internal_service(secret, status)
    port = server.sockets[0].getsockname()[1]
    try:
        core = strict(client.app.ctx.core, f"127.0.0.1:{port}")
        provider = await Provider.acreate(name="p", kind="openai_compatible", model_id="m",
                                          base_url=f"http://127.0.0.1:{port}/v1")
        answer = await provider_service.check_provider(core, provider_id=provider.id)
    finally:
        server.close()
        await server.wait_closed()
    assert answer["ok"] is False and "internal-secret-4711" not in json.dumps(answer)


ANTHROPIC_MODELS = json.dumps({"data": [{"id": "claude-test", "type": "model", "display_name": "t",
                                           "created_at": "2025-01-01T00:00:00Z"}],
                                 "has_more": False, "first_id": "claude-test", "last_id": "claude-test"}).encode()


async def test_a_redirect_to_an_address_not_allowed_is_refused(client, admin):
    """The Anthropic SDK follows redirects: a server on an allowed port redirects to
    another loopback port, which is refused (every new connection is checked); with
    both listed the check works."""
    models = await _internal_service(ANTHROPIC_MODELS)
    target = models.sockets[0].getsockname()[1]

    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{target}/v1/models\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    hop = await asyncio.start_server(redirect, "127.0.0.1", 0)
    port = hop.sockets[0].getsockname()[1]
    try:
        provider = await Provider.acreate(name="a", kind="anthropic", model_id="claude-test",
                                          base_url=f"http://127.0.0.1:{port}",
                                          api_key_encrypted=client.app.ctx.core.secrets.encrypt("sk-ant-123456"))
        core = client.app.ctx.core
        answer = await provider_service.check_provider(strict(core, f"127.0.0.1:{port}"), provider_id=provider.id)
        assert answer["ok"] is False and "egress rule" in answer["error"], answer
        assert f"127.0.0.1:{target}" in answer["error"] and SETTING in answer["error"]
        both = strict(core, f"127.0.0.1:{port},127.0.0.1:{target}")
        assert await provider_service.check_provider(both, provider_id=provider.id) == {
            "ok": True, "models": ["claude-test"]}
    finally:
        for server in (hop, models):
            server.close()
            await server.wait_closed()


async def test_a_stored_internal_mcp_url_is_refused_at_refresh(client, admin, fake_mcp):
    core = client.app.ctx.core
    saved = await mcp_service.create_server(strict(core, "127.0.0.1"), name="m", transport="streamable_http",
                                            url=fake_mcp.url)
    assert saved.last_error is None
    before = fake_mcp.stats().get("connects", 0)
    response = await client.post(f"{MCP}/{saved.id}/refresh", headers=admin["headers"])
    assert response.status_code == 200
    error = response.json()["server"]["last_error"]
    assert "egress rule" in error and SETTING in error and fake_mcp.stats().get("connects", 0) == before


def test_bad_entries_of_the_setting_stop_the_start():
    from orchestra.settings import Settings

    for bad in ("127.0.0.1:99999", "[::1", "10.0.0.0/33", "127.1", "bad host"):
        with pytest.raises(ValueError, match=SETTING):
            Settings.from_env(env={"ORCHESTRA_EGRESS_ALLOW": bad})
    ok = Settings.from_env(env={"ORCHESTRA_EGRESS_ALLOW": " 10.0.0.0/8, [::1]:11434 ,ollama.internal:80,::1"})
    assert len(ok.egress.entries) == 4
