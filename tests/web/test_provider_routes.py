"""`/api/v1/provider`: registration rules, masking, access, conflicts and the live check."""

from __future__ import annotations

import pytest

from orchestra.db.models import Provider, Worker
from orchestra.engine.llm.factory import SUPPORTED_KINDS

URL = "/api/v1/provider"
KEY = "sk-test-1234567890abcd"


def body(**overrides):
    return {"name": "main", "provider": "deepseek", "model_id": "deepseek-chat", "api_key": KEY, **overrides}


async def register(client, admin, **overrides):
    response = await client.post(URL, json=body(**overrides), headers=admin["headers"])
    assert response.status_code == 201, response.text
    return response.json()


async def test_register_returns_201_with_masked_key_and_stores_no_plain_key(client, admin):
    data = await register(client, admin)
    assert data["message"] == "success"
    assert data["provider"] == "deepseek" and data["model_id"] == "deepseek-chat"
    assert data["name"] == "main" and data["provider_id"] == data["id"]
    assert data["api_key"] == "sk-…abcd"
    assert KEY not in str(data)
    row = await Provider.aget(Provider.id == data["provider_id"])
    assert KEY not in (row.api_key_encrypted or "") and row.api_key_hint == "sk-…abcd"
    assert client.app.ctx.core.secrets.decrypt(row.api_key_encrypted) == KEY
    listed = (await client.get(URL, headers=admin["headers"])).json()
    assert KEY not in str(listed)


@pytest.mark.parametrize("kind", SUPPORTED_KINDS)
async def test_every_supported_kind_registers(client, admin, kind):
    data = await register(client, admin, provider=kind, base_url="http://127.0.0.1:9/v1")
    assert data["provider"] == kind and data["base_url"] == "http://127.0.0.1:9/v1"


async def test_gemini_is_422_naming_the_supported_kinds(client, admin):
    response = await client.post(URL, json=body(provider="gemini"), headers=admin["headers"])
    assert response.status_code == 422
    data = response.json()
    assert data["error"] == "ValidationError"
    for kind in SUPPORTED_KINDS:
        assert kind in data["message"] and kind in data["detail"][0]["problem"]
    assert data["detail"][0]["field"] == "provider"
    assert await client.app.ctx.core.db.count(Provider.select()) == 0
    response = await client.post(URL, json={"provider": "gemini", "model_id": "gemini-pro"}, headers=admin["headers"])
    assert response.status_code == 422  # with another field missing, the kinds are still named
    assert all(kind in response.json()["message"] for kind in SUPPORTED_KINDS)
    assert {d["field"] for d in response.json()["detail"]} == {"name", "provider"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"provider": "openai_compatible", "base_url": None}, "base_url"),
        ({"base_url": "ftp://example.com"}, "base_url"),
        ({"base_url": "not a url"}, "base_url"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 129}, "name"),
        ({"name": 5}, "name"),
        ({"model_id": ""}, "model_id"),
        ({"model_id": 3}, "model_id"),
        ({"api_key": 12345}, "api_key"),
        ({"api_key": "has space"}, "api_key"),
        ({"api_key": "sk-é-not-ascii"}, "api_key"),  # cannot be sent in a header (was a 500 at check)
        ({"base_url": "http://host:port"}, "base_url"),  # no port number (was a 500 at check)
        ({"base_url": "http://host:99999"}, "base_url"),
        ({"base_url": "http://ho\x02st"}, "base_url"),  # a control character (was a 500 at check)
        ({"base_url": "http://a b"}, "base_url"),
        ({"base_url": "http://["}, "base_url"),
        # hosts the HTTP clients refuse (each was a 500 at check): IDNA, malformed IPv4
        ({"base_url": "http://xn--zz.com/v1"}, "base_url"),
        ({"base_url": "http://\u0378.com"}, "base_url"),
        ({"base_url": "http://a\u0300b.example"}, "base_url"),
        ({"base_url": "http://999.1.1.1/v1"}, "base_url"),
        ({"base_url": "http://1a2b3c4"}, "base_url"),
        ({"base_url": "http://a..b"}, "base_url"),
        ({"base_url": "http://[:::1]"}, "base_url"),
        ({"provider": None}, "provider"),
    ],
)
async def test_bad_fields_are_422_with_field_detail(client, admin, overrides, field):
    response = await client.post(URL, json=body(**overrides), headers=admin["headers"])
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "ValidationError"
    assert field in [d["field"] for d in response.json()["detail"]]


async def test_missing_fields_are_422(client, admin):
    response = await client.post(URL, json={"name": "x"}, headers=admin["headers"])
    assert response.status_code == 422
    fields = {d["field"] for d in response.json()["detail"]}
    assert {"provider", "model_id"} <= fields


async def test_not_json_is_400(client, admin):
    response = await client.post(URL, content=b"[1]", headers={**admin["headers"], "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"] == "BadRequestError"


async def test_duplicate_name_is_409(client, admin):
    await register(client, admin)
    response = await client.post(URL, json=body(name="MAIN"), headers=admin["headers"])
    assert response.status_code == 409 and response.json()["error"] == "ConflictError"


async def test_access_rules(client, admin, user):
    response = await client.post(URL, json=body())
    assert response.status_code == 401 and response.json()["error"] == "AuthenticationRequiredError"
    response = await client.post(URL, json=body(), headers=user["headers"])
    assert response.status_code == 403 and response.json()["error"] == "PermissionDeniedError"
    data = await register(client, admin)
    pid = data["provider_id"]
    assert (await client.get(URL)).status_code == 401
    listed = await client.get(URL, headers=user["headers"])
    assert listed.status_code == 200 and [p["provider_id"] for p in listed.json()["providers"]] == [pid]
    assert (await client.get(f"{URL}/{pid}", headers=user["headers"])).json()["name"] == "main"
    for method, path in [("DELETE", f"{URL}/{pid}"), ("POST", f"{URL}/{pid}/check"), ("PUT", f"{URL}/{pid}")]:
        response = await client.request(method, path, json={"model_id": "x"}, headers=user["headers"])
        assert response.status_code == 403, (method, path)
    assert await client.app.ctx.core.db.count(Provider.select()) == 1


async def test_unknown_id_is_404(client, admin):
    for method, path in [("GET", f"{URL}/nope"), ("DELETE", f"{URL}/nope"), ("POST", f"{URL}/nope/check")]:
        response = await client.request(method, path, headers=admin["headers"])
        assert response.status_code == 404 and response.json()["error"] == "NotFoundError"


async def test_get_and_delete(client, admin):
    pid = (await register(client, admin))["provider_id"]
    response = await client.get(f"{URL}/{pid}", headers=admin["headers"])
    assert response.status_code == 200 and response.json()["api_key"] == "sk-…abcd"
    response = await client.delete(f"{URL}/{pid}", headers=admin["headers"])
    assert response.status_code == 200 and response.json() == {"message": "success"}
    assert await Provider.aget_or_none(Provider.id == pid) is None
    assert (await client.get(f"{URL}/{pid}", headers=admin["headers"])).status_code == 404


async def test_update_changes_fields_and_key(client, admin):
    pid = (await register(client, admin))["provider_id"]
    response = await client.put(
        f"{URL}/{pid}", json={"model_id": "deepseek-reasoner", "api_key": "sk-new-key-9999"}, headers=admin["headers"]
    )
    assert response.status_code == 200, response.text
    assert response.json()["model_id"] == "deepseek-reasoner" and response.json()["api_key"] == "sk-…9999"
    response = await client.put(f"{URL}/{pid}", json={"provider": "openai"}, headers=admin["headers"])
    assert response.status_code == 422  # the kind is fixed
    response = await client.put(f"{URL}/{pid}", json={"name": None}, headers=admin["headers"])
    assert response.status_code == 422
    response = await client.put(f"{URL}/{pid}", json={"api_key": None}, headers=admin["headers"])
    assert response.json()["api_key"] is None and response.json()["has_api_key"] is False


async def test_delete_provider_in_use_is_409_naming_the_workers(client, admin):
    pid = (await register(client, admin))["provider_id"]
    response = await client.post(
        "/api/v1/agent/worker", json={"name": "writer", "provider_id": pid, "tools": []}, headers=admin["headers"]
    )
    assert response.status_code == 201, response.text
    response = await client.put("/api/v1/agent/node/planner", json={"provider": pid}, headers=admin["headers"])
    assert response.status_code == 200
    response = await client.delete(f"{URL}/{pid}", headers=admin["headers"])
    assert response.status_code == 409
    data = response.json()
    assert data["error"] == "ConflictError" and "writer" in data["message"] and "planner" in data["message"]
    assert [w["name"] for w in data["detail"]["workers"]] == ["writer"]
    assert data["detail"]["nodes"] == ["planner"]
    assert await Provider.aget_or_none(Provider.id == pid) is not None
    assert await client.app.ctx.core.db.count(Worker.select()) == 1


async def test_check_lists_models_from_the_provider(client, admin, fake_llm):
    pid = (await register(client, admin, provider="openai_compatible", base_url=fake_llm.base_url, api_key="good-key"))["provider_id"]
    response = await client.post(f"{URL}/{pid}/check", headers=admin["headers"])
    assert response.status_code == 200, response.text
    assert response.json() == {"message": "success", "ok": True, "models": sorted(fake_llm.models)}
    seen = [r for r in fake_llm.requests if r.path.endswith("/models")]
    assert seen and seen[-1].headers["authorization"] == "Bearer good-key"


async def test_check_with_a_bad_key_is_ok_false_without_the_providers_body(client, admin, fake_llm):
    pid = (await register(client, admin, provider="openai_compatible", base_url=fake_llm.base_url, api_key="bad-key"))["provider_id"]
    response = await client.post(f"{URL}/{pid}/check", headers=admin["headers"])
    assert response.status_code == 200, response.text
    assert response.json() == {"message": "success", "ok": False,
                               "error": "Provider 'main' refused the API key (HTTP 401); check the key."}
    assert "Incorrect API key provided" not in response.text  # the provider's own words stay out


async def test_check_of_an_unreachable_provider_is_ok_false(client, admin):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    pid = (await register(client, admin, provider="ollama", base_url=url, api_key=None))["provider_id"]
    response = await client.post(f"{URL}/{pid}/check", headers=admin["headers"])
    assert response.status_code == 200, response.text
    assert response.json()["ok"] is False and "could not be reached" in response.json()["error"]


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/v1", "https://api.example.com/v1", "http://[::1]:11434", "http://[2606:4700::1111]/v1",
    "HTTP://local_host:65535/x?y#z", "http://10.0.0.1.", "  http://host/v1/  ",
])
async def test_usable_base_urls_are_kept(client, admin, url):
    import httpx

    response = await client.post(URL, json=body(base_url=url), headers=admin["headers"])
    assert response.status_code == 201, response.text
    kept = response.json()["base_url"]
    assert kept == url.strip().rstrip("/")
    httpx.URL(kept)  # the HTTP clients read it


async def test_update_to_an_unusable_host_is_422_and_keeps_the_old_url(client, admin):
    pid = (await register(client, admin, provider="ollama", base_url="http://127.0.0.1:9/v1"))["provider_id"]
    response = await client.put(f"{URL}/{pid}", json={"base_url": "http://xn--zz.com"}, headers=admin["headers"])
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "base_url"
    assert (await client.get(f"{URL}/{pid}", headers=admin["headers"])).json()["base_url"] == "http://127.0.0.1:9/v1"


async def test_check_of_a_stored_unusable_host_is_ok_false_not_500(client, admin):
    """A base_url stored before hosts were checked: the check answers ok: false."""
    from orchestra.db.models import Provider

    pid = (await register(client, admin, provider="ollama", base_url="http://127.0.0.1:9/v1"))["provider_id"]
    await Provider.update(base_url="http://\u0378.com/v1").where(Provider.id == pid).aexecute()
    client.app.ctx.core.extras.pop("providers", None)
    response = await client.post(f"{URL}/{pid}/check", headers=admin["headers"])
    assert response.status_code == 200, response.text
    assert response.json()["ok"] is False and "not a usable URL" in response.json()["error"]
