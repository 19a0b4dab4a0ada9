"""A real server must not let idle keep-alive clients or queued logins pin the store pool.

playhouse.pwasyncio keeps a pooled connection for the life of the asyncio task that
used it, and Sanic serves every request of a keep-alive connection in one task; the
pool has 8 connections. These tests open more clients than that.
"""

from __future__ import annotations

import time

import httpx

ADMIN = ("pool_admin", "pool-admin-password")


def _admin_token(server) -> str:
    made = server.cli("user", "create", ADMIN[0], "--role", "SUPER_ADMINISTRATOR",
                      "--password-stdin", input=ADMIN[1] + "\n")
    assert made.returncode == 0, made.stderr
    answer = httpx.post(f"{server.base_url}/api/v1/auth/login",
                        json={"user_name": ADMIN[0], "password": ADMIN[1]}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["access_token"]


def test_idle_keep_alive_clients_do_not_exhaust_the_store_pool(server):
    token = _admin_token(server)
    headers = {"Authorization": f"Bearer {token}"}
    clients = [httpx.Client(base_url=server.base_url, headers=headers, timeout=30) for _ in range(12)]
    try:
        for client in clients:  # each keeps its connection open afterwards
            assert client.get("/api/v1/auth/list").status_code == 200
        started = time.monotonic()
        for client in clients:  # a second round on the same connections
            answer = client.get("/api/v1/auth/list")
            assert answer.status_code == 200, answer.text
            assert [u["user_name"] for u in answer.json()["users"]] == [ADMIN[0]]
        assert time.monotonic() - started < 5  # no waiting on the pool's 10 s timeout
    finally:
        for client in clients:
            client.close()


def test_logins_waiting_for_argon2_do_not_hold_store_connections(tmp_path):
    from tests.conftest import ServerProcess

    # One hashing thread and a slow hash: 16 logins queue for several seconds.
    slow = {"ORCHESTRA_ARGON2_TIME_COST": "10", "ORCHESTRA_ARGON2_MEMORY_COST": "65536",
            "ORCHESTRA_ARGON2_PARALLELISM": "1", "ORCHESTRA_HASH_CONCURRENCY": "1"}
    server = ServerProcess(tmp_path / "home", env=slow).start()
    try:
        token = _admin_token(server)
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            logins = [pool.submit(httpx.post, f"{server.base_url}/api/v1/auth/login",
                                  json={"user_name": ADMIN[0], "password": ADMIN[1]}, timeout=120)
                      for _ in range(16)]
            time.sleep(1.0)
            started = time.monotonic()
            listed = httpx.get(f"{server.base_url}/api/v1/auth/list",
                               headers={"Authorization": f"Bearer {token}"}, timeout=30)
            waited = time.monotonic() - started
            statuses = sorted(f.result().status_code for f in logins)
        assert listed.status_code == 200, listed.text
        assert waited < 2, f"/list waited {waited:.1f}s behind queued logins"
        assert statuses == [200] * 16
    finally:
        server.stop()
