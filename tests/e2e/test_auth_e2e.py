"""Auth end to end: a real `python -m orchestra serve` process, httpx over loopback, the CLI."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import ServerProcess

PASSWORD = "password-123"


@pytest.fixture(params=["sqlite", "postgres"])
def any_server(request, tmp_path):
    """A server on SQLite (its default store) or on a fresh PostgreSQL database."""
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    proc = ServerProcess(tmp_path / "server-home", database_url=url).start()
    yield proc
    proc.stop()


def test_register_login_refresh_promote_list_authority_delete(server):
    api = httpx.Client(base_url=f"{server.base_url}/api/v1/auth", timeout=30)
    with api:
        created = api.post("/register", json={"user_name": "alice", "password": PASSWORD})
        assert created.status_code == 201, created.text
        alice_id = created.json()["user_id"]
        assert api.post("/register", json={"user_name": "bob", "password": PASSWORD}).status_code == 201

        logged = api.post("/login", json={"user_name": "alice", "password": PASSWORD})
        assert logged.status_code == 200
        pair = logged.json()
        assert pair["token"] == pair["access_token"]
        refreshed = api.post("/refresh", json={"refresh_token": pair["refresh_token"]})
        assert refreshed.status_code == 200
        assert api.post("/refresh", json={"refresh_token": pair["refresh_token"]}).status_code == 401

        # alice is a USER: the user list is closed to her.
        user_headers = {"Authorization": f"Bearer {refreshed.json()['access_token']}"}
        denied = api.get("/list", headers=user_headers)
        assert denied.status_code == 403 and denied.json()["error"] == "PermissionDeniedError"

        # The first super administrator is made from the CLI, against the server's store.
        promoted = server.cli("user", "promote", "alice")
        assert promoted.returncode == 0, promoted.stderr
        # The role change ended her sessions; a new login carries the new role.
        assert api.post("/refresh", json={"refresh_token": refreshed.json()["refresh_token"]}).status_code == 401
        token = api.post("/login", json={"user_name": "alice", "password": PASSWORD}).json()["access_token"]
        admin = {"Authorization": f"Bearer {token}"}

        listed = api.get("/list", headers=admin)
        assert listed.status_code == 200
        users = listed.json()["users"]
        assert [(u["user_name"], u["role"]) for u in users] == [("alice", "SUPER_ADMINISTRATOR"), ("bob", "USER")]
        bob_id = users[1]["user_id"]

        changed = api.put("/authority", headers=admin, json={"user_id": bob_id, "new_authority": "ADMINISTRATOR"})
        assert changed.json() == {"message": "success", "user_id": bob_id, "new_authority": "ADMINISTRATOR"}
        last = api.put("/authority", headers=admin, json={"user_id": alice_id, "new_authority": "USER"})
        assert last.status_code == 409 and last.json()["error"] == "LastSuperAdministratorError"

        deleted = api.delete(f"/{bob_id}", headers=admin)
        assert deleted.status_code == 200 and deleted.json() == {"message": "success"}
        gone = api.delete(f"/{bob_id}", headers=admin)
        assert gone.status_code == 404 and gone.json()["error"] == "UserNotExistError"
        assert api.post("/login", json={"user_name": "bob", "password": PASSWORD}).status_code == 404

    # The CLI sees what the API did.
    done = server.cli("user", "list", "--json")
    assert done.returncode == 0
    assert [u["user_name"] for u in json.loads(done.stdout)] == ["alice"]


def test_routing_and_body_errors_on_the_real_http_server(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        response = http.get("/api/v1/auth/register")
        assert response.status_code == 405 and "POST" in response.headers["Allow"]
        assert response.json()["error"] == "MethodNotAllowedError"
        response = http.get("/api/v1/nothing-here")
        assert response.status_code == 404 and response.json()["error"] == "NotFoundError"
        response = http.post("/api/v1/auth/register", content=b"{oops", headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and response.json()["error"] == "BadRequestError"
        big = b'{"user_name": "x", "password": "' + b"p" * (2 * 1024 * 1024) + b'"}'
        response = http.post("/api/v1/auth/register", content=big, headers={"Content-Type": "application/json"})
        assert response.status_code == 413 and response.json()["error"] == "PayloadTooLargeError"


async def _burst(base_url: str, n: int, request) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:
        return await asyncio.gather(*(request(http) for _ in range(n)))


def test_fifty_simultaneous_registrations_and_twenty_refreshes(any_server):
    base = f"{any_server.base_url}/api/v1/auth"
    responses = asyncio.run(_burst(base, 50, lambda http: http.post(
        "/register", json={"user_name": "racer", "password": PASSWORD})))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * 49, statuses
    assert {r.json()["error"] for r in responses if r.status_code == 409} == {"UserAlreadyExistsError"}

    token = httpx.post(f"{base}/login", json={"user_name": "racer", "password": PASSWORD},
                       timeout=30).json()["refresh_token"]
    responses = asyncio.run(_burst(base, 20, lambda http: http.post("/refresh", json={"refresh_token": token})))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] + [401] * 19, statuses

    done = any_server.cli("user", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert [u["user_name"] for u in json.loads(done.stdout)] == ["racer"]


def test_rate_limits_on_the_real_server(tmp_path):
    proc = ServerProcess(tmp_path / "home", env={"ORCHESTRA_RATE_LIMIT_REGISTER": "2/minute"}).start()
    try:
        with httpx.Client(base_url=f"{proc.base_url}/api/v1/auth", timeout=30) as api:
            assert api.post("/register", json={"user_name": "alice", "password": PASSWORD}).status_code == 201
            assert api.post("/register", json={"user_name": 5}).status_code == 422
            refused = api.post("/register", json={"user_name": 5})
            assert refused.status_code == 429 and refused.json()["error"] == "RateLimitedError"
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.headers["RateLimit-Limit"] == "2" and refused.headers["RateLimit-Remaining"] == "0"
            # Login has its own limiter.
            assert api.post("/login", json={"user_name": "alice", "password": PASSWORD}).status_code == 200
    finally:
        proc.stop()
