"""SPEC §1's error table, row by row, as far as it applies to auth (plus routing errors).

Every error, from every route, is JSON of one shape: message, error, optional detail.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import jwt
import pytest

from orchestra.services import auth as auth_service

AUTH = "/api/v1/auth"
SECRET = "test-secret-" + "x" * 32
PASSWORD = "password-123"


def check(response: httpx.Response, status: int, error: str) -> dict:
    """The one error shape of SPEC §1, with this status and name."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0] == "application/json"
    body = response.json()
    assert set(body) in ({"message", "error"}, {"message", "error", "detail"}), body
    assert body["error"] == error
    assert isinstance(body["message"], str) and body["message"].strip()
    assert "Traceback" not in response.text and "<html" not in response.text.lower()
    return body


# --- 400 BadRequestError ------------------------------------------------------------------


@pytest.mark.parametrize("route", ["register", "login", "refresh"])
async def test_400_for_bodies_that_are_not_a_json_object(client, route):
    url = f"{AUTH}/{route}"
    json_ct = {"Content-Type": "application/json"}
    for raw in (b"{", b"not json", b"\xff\xfe{}", b"", b"   "):
        check(await client.post(url, content=raw, headers=json_ct), 400, "BadRequestError")
    for value in ([], ["user_name"], "text", 42, None, True):
        check(await client.post(url, json=value), 400, "BadRequestError")
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        response = await client.post(
            url, content=b'{"user_name": "alice", "password": "password-123"}',
            headers={"Content-Type": content_type},
        )
        body = check(response, 400, "BadRequestError")
        assert "application/json" in body["message"]


async def test_400_on_authority_after_authentication(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    response = await client.put(f"{AUTH}/authority", content=b"[1,", headers={
        **root["headers"], "Content-Type": "application/json"})
    check(response, 400, "BadRequestError")


async def test_json_with_a_charset_or_without_content_type_is_accepted(client):
    body = b'{"user_name": "alice", "password": "password-123"}'
    response = await client.post(f"{AUTH}/register", content=body,
                                 headers={"Content-Type": "application/json; charset=utf-8"})
    assert response.status_code == 201
    response = await client.post(f"{AUTH}/login", content=body)  # no Content-Type at all
    assert response.status_code == 200


# --- 401 ----------------------------------------------------------------------------------


async def test_401_authentication_required(client):
    check(await client.get(f"{AUTH}/list"), 401, "AuthenticationRequiredError")


async def test_401_token_invalid(client):
    response = await client.get(f"{AUTH}/list", headers={"Authorization": "Bearer nonsense"})
    check(response, 401, "TokenInvalidError")
    check(await client.post(f"{AUTH}/refresh", json={"refresh_token": "nonsense"}),
          401, "TokenInvalidError")


async def test_401_token_expired(client, users):
    alice = await users.make("alice")
    past = int(time.time()) - 10
    token = jwt.encode({"sub": alice["user_id"], "name": "alice", "role": "USER", "type": "access",
                        "jti": uuid.uuid4().hex, "iat": past - 900, "exp": past, "iss": "orchestra"},
                       SECRET, algorithm="HS256")
    check(await client.get(f"{AUTH}/list", headers={"Authorization": f"Bearer {token}"}),
          401, "TokenExpiredError")


async def test_401_invalid_credentials(client, users):
    await users.make("alice")
    response = await client.post(f"{AUTH}/login", json={"user_name": "alice", "password": "wrong-one!"})
    check(response, 401, "InvalidCredentialsError")


# --- 403, 404, 405, 409 -----------------------------------------------------------------


async def test_403_permission_denied(client, users):
    alice = await users.make("alice")
    check(await client.get(f"{AUTH}/list", headers=alice["headers"]), 403, "PermissionDeniedError")


async def test_404_user_not_exist(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    check(await client.post(f"{AUTH}/login", json={"user_name": "ghost", "password": PASSWORD}),
          404, "UserNotExistError")
    response = await client.put(f"{AUTH}/authority", headers=root["headers"],
                                json={"user_id": str(uuid.uuid4()), "new_authority": "USER"})
    check(response, 404, "UserNotExistError")
    check(await client.delete(f"{AUTH}/{uuid.uuid4()}", headers=root["headers"]), 404, "UserNotExistError")


@pytest.mark.parametrize(
    "method,path",
    [("GET", "/index.html"), ("GET", "/nope"), ("POST", "/api/v1/auth/nope/deeper"), ("GET", "/api/v2/auth/list"),
     ("GET", "/api/v1/health"), ("GET", "/api/v1/cluster"), ("GET", "/api/v1/workflow/ws"),
     ("POST", "/api/v1/auth")],
)
async def test_404_not_found_for_unknown_routes(client, method, path):
    body = check(await client.request(method, path), 404, "NotFoundError")
    assert path in body["message"]


@pytest.mark.parametrize(
    "method,path,allowed",
    [
        ("GET", "/register", {"POST"}),
        ("PUT", "/login", {"POST"}),
        ("GET", "/refresh", {"POST"}),
        ("POST", "/list", {"GET"}),
        ("DELETE", "/authority", {"PUT"}),
        ("GET", "/0b5e7a3c-2d1f-4c8e-9a6b-7f3e1d2c4b5a", {"DELETE"}),  # any user id
        ("PATCH", "/authority", {"PUT"}),
    ],
)
async def test_405_with_an_allow_header(client, method, path, allowed):
    response = await client.request(method, f"{AUTH}{path}")
    check(response, 405, "MethodNotAllowedError")
    listed = {m.strip() for m in response.headers["Allow"].split(",")}
    assert allowed <= listed and method not in listed


async def test_409_user_already_exists_and_last_super_administrator(client, users):
    root = await users.make("root", "SUPER_ADMINISTRATOR")
    response = await client.post(f"{AUTH}/register", json={"user_name": "ROOT", "password": PASSWORD})
    check(response, 409, "UserAlreadyExistsError")
    response = await client.put(f"{AUTH}/authority", headers=root["headers"],
                                json={"user_id": root["user_id"], "new_authority": "USER"})
    check(response, 409, "LastSuperAdministratorError")
    check(await client.delete(f"{AUTH}/{root['user_id']}", headers=root["headers"]),
          409, "LastSuperAdministratorError")


# --- 413, 422 -----------------------------------------------------------------------------


class TestPayloadTooLarge:
    @pytest.fixture
    def settings_overrides(self):
        return {"request_max_bytes": 2048}

    async def test_413_for_a_body_over_the_limit(self, client):
        big = {"user_name": "alice", "password": "p" * 4000}
        for route in ("register", "login", "refresh"):
            check(await client.post(f"{AUTH}/{route}", json=big), 413, "PayloadTooLargeError")
        # Just under the limit is read (and then validated).
        response = await client.post(f"{AUTH}/register", json={"user_name": "alice", "password": "p" * 1900})
        check(response, 422, "ValidationError")


async def test_422_lists_each_problem_with_field_and_problem(client):
    response = await client.post(f"{AUTH}/register", json={"user_name": 5, "password": None})
    body = check(response, 422, "ValidationError")
    assert isinstance(body["detail"], list) and len(body["detail"]) == 2
    for item in body["detail"]:
        assert set(item) == {"field", "problem"}
        assert isinstance(item["problem"], str) and item["problem"]
    assert {item["field"] for item in body["detail"]} == {"user_name", "password"}
    # Service-level rules answer in the same shape.
    body = check(await client.post(f"{AUTH}/register", json={"user_name": "a b", "password": PASSWORD}),
                 422, "ValidationError")
    assert body["detail"] == [{"field": "user_name",
                               "problem": "may contain only letters, digits and the characters _ . - @"}]


# --- 429, 503 -----------------------------------------------------------------------------


class TestRateLimited:
    @pytest.fixture
    def settings_overrides(self):
        return {"rate_limit_register": "1/minute", "rate_limit_login": "1/minute"}

    async def test_429_with_retry_after(self, client):
        for route in ("register", "login"):
            await client.post(f"{AUTH}/{route}", json={})
            response = await client.post(f"{AUTH}/{route}", json={})
            check(response, 429, "RateLimitedError")
            assert int(response.headers["Retry-After"]) >= 1
            for header in ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"):
                assert response.headers[header].isdigit()


class TestOverloaded:
    @pytest.fixture
    def settings_overrides(self):
        return {"hash_concurrency": 1, "hash_queue": 0, "argon2_time_cost": 3, "argon2_memory_cost": 16384}

    async def test_503_overloaded_with_retry_after(self, client):
        bodies = [{"user_name": f"user{i}", "password": PASSWORD} for i in range(6)]
        responses = await asyncio.gather(*(client.post(f"{AUTH}/register", json=b) for b in bodies))
        overloaded = [r for r in responses if r.status_code == 503]
        assert overloaded and {r.status_code for r in responses} <= {201, 503}
        for response in overloaded:
            check(response, 503, "OverloadedError")
            assert int(response.headers["Retry-After"]) >= 1
        created = sum(r.status_code == 201 for r in responses)
        assert len(await auth_service.list_users(client.app.ctx.core)) == created
