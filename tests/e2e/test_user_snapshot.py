"""The server keeps a copy of the user table between requests (SQLite `data_version`).

Changes made by another process — the `orchestra user` CLI on the same store — must
be seen by the very next request: a demoted or deleted administrator's token stops
working at once, and a new user shows up in the list at once.
"""

from __future__ import annotations

import httpx


def _create(server, name: str, role: str = "USER") -> None:
    made = server.cli("user", "create", name, "--role", role, "--password-stdin",
                      input=f"{name}-password\n")
    assert made.returncode == 0, made.stderr


def _login(server, name: str) -> dict[str, str]:
    answer = httpx.post(f"{server.base_url}/api/v1/auth/login",
                        json={"user_name": name, "password": f"{name}-password"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


def _names(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [u["user_name"] for u in answer.json()["users"]]


def test_changes_from_another_process_are_seen_by_the_next_request(server):
    _create(server, "alpha", "SUPER_ADMINISTRATOR")
    _create(server, "bravo", "SUPER_ADMINISTRATOR")
    alpha, bravo = _login(server, "alpha"), _login(server, "bravo")
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        for _ in range(3):  # the copy is taken and then served
            assert _names(client.get("/api/v1/auth/list", headers=alpha)) == ["alpha", "bravo"]

        _create(server, "charlie")
        assert _names(client.get("/api/v1/auth/list", headers=alpha)) == ["alpha", "bravo", "charlie"]

        demoted = server.cli("user", "demote", "alpha")
        assert demoted.returncode == 0, demoted.stderr
        refused = client.get("/api/v1/auth/list", headers=alpha)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "PermissionDeniedError"
        listed = client.get("/api/v1/auth/list", headers=bravo).json()["users"]
        assert {u["user_name"]: u["role"] for u in listed}["alpha"] == "USER"

        promoted = server.cli("user", "promote", "alpha")
        assert promoted.returncode == 0, promoted.stderr
        assert _names(client.get("/api/v1/auth/list", headers=alpha)) == ["alpha", "bravo", "charlie"]

        deleted = server.cli("user", "delete", "bravo", "--yes")
        assert deleted.returncode == 0, deleted.stderr
        gone = client.get("/api/v1/auth/list", headers=bravo)
        assert gone.status_code == 401, gone.text
        assert gone.json()["error"] == "TokenInvalidError"
        assert _names(client.get("/api/v1/auth/list", headers=alpha)) == ["alpha", "charlie"]


def test_changes_through_the_api_are_seen_by_the_next_request(server):
    _create(server, "delta", "SUPER_ADMINISTRATOR")
    _create(server, "echo", "SUPER_ADMINISTRATOR")
    delta, echo = _login(server, "delta"), _login(server, "echo")
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        users = client.get("/api/v1/auth/list", headers=delta).json()["users"]
        echo_id = next(u["user_id"] for u in users if u["user_name"] == "echo")
        changed = client.put("/api/v1/auth/authority", headers=delta,
                             json={"user_id": echo_id, "new_authority": "ADMINISTRATOR"})
        assert changed.status_code == 200, changed.text
        assert client.get("/api/v1/auth/list", headers=echo).status_code == 403
        registered = client.post("/api/v1/auth/register",
                                 json={"user_name": "foxtrot", "password": "foxtrot-password"})
        assert registered.status_code == 201, registered.text
        assert _names(client.get("/api/v1/auth/list", headers=delta)) == ["delta", "echo", "foxtrot"]
