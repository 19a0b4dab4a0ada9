"""A request that cannot be served in time answers 503 `OverloadedError` with
`Retry-After`, in SPEC §1's JSON shape — never 500 (SPEC §15). A real server with a short
`ORCHESTRA_RESPONSE_TIMEOUT`; its login is held up by a real cause: another process
holds the SQLite store's write lock, so the new refresh token cannot be written.
"""

from __future__ import annotations

import sqlite3
import time

import httpx
import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e


def test_a_request_held_past_the_response_timeout_answers_503(tmp_path):
    server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_RESPONSE_TIMEOUT": "1"}).start()
    try:
        made = server.cli("user", "create", "alice", "--password-stdin", input="password-123\n")
        assert made.returncode == 0, made.stderr
        login = {"user_name": "alice", "password": "password-123"}
        url = f"{server.base_url}/api/v1/auth/login"
        assert httpx.post(url, json=login, timeout=30).status_code == 200

        holder = sqlite3.connect(server.home / "orchestra.db", isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the store's write lock, for 10 s at most
            started = time.monotonic()
            answer = httpx.post(url, json=login, timeout=30)
            waited = time.monotonic() - started
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["error"] == "OverloadedError" and set(body) <= {"message", "error", "detail"}
        assert "ORCHESTRA_RESPONSE_TIMEOUT" in body["message"]
        assert int(answer.headers["Retry-After"]) >= 1
        assert answer.headers["content-type"].startswith("application/json")
        # The cancelled login's store connection settles first (its statement waits in
        # SQLite's thread for the lock, up to the 10 s busy timeout), then it answers.
        assert waited < 15, waited

        # The server goes on: the same request is served once the lock is gone.
        assert httpx.post(url, json=login, timeout=30).status_code == 200
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "Traceback" not in log and "unhandled error" not in log, log
