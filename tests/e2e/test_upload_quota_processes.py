"""The per-user upload quota holds across processes (SPEC §15): two real `orchestra
serve` processes on one PostgreSQL database, one user's uploads sent to both at once,
and together they never pass `ORCHESTRA_UPLOAD_QUOTA_BYTES`; what was refused left no
file on either process's disk and no row."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e

QUOTA = 100_000
URL = "/api/v1/adapter/client/upload"


def test_two_processes_together_keep_one_users_quota(tmp_path, postgres_url):
    env = {"ORCHESTRA_UPLOAD_QUOTA_BYTES": str(QUOTA)}
    a = ServerProcess(tmp_path / "a", database_url=postgres_url, env=env).start()
    b = ServerProcess(tmp_path / "b", database_url=postgres_url, env=env).start()
    try:
        made = a.cli("user", "create", "alice", "--password-stdin", input="password-123\n")
        assert made.returncode == 0, made.stderr
        login = httpx.post(f"{a.base_url}/api/v1/auth/login",
                           json={"user_name": "alice", "password": "password-123"}, timeout=30)
        headers = {"Authorization": f"Bearer {login.json()['access_token']}"}

        def upload(server: ServerProcess) -> httpx.Response:
            return httpx.post(f"{server.base_url}{URL}", headers=headers, timeout=60,
                              files=[("file", ("part.bin", b"x" * 30_000, "application/octet-stream"))])

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(upload, [a, b] * 4))
        statuses = sorted(answer.status_code for answer in answers)
        assert statuses == [201] * 3 + [413] * 5, [answer.text for answer in answers]
        for answer in answers:
            if answer.status_code == 413:
                body = answer.json()
                assert body["error"] == "PayloadTooLargeError" and str(QUOTA) in body["message"]

        listed = httpx.get(f"{b.base_url}{URL}", headers=headers, timeout=30).json()["files"]
        assert sum(f["size"] for f in listed) == 90_000
        kept = {f["file_id"] for f in listed}
        on_disk = set()
        for server in (a, b):
            for folder in (server.home / "uploads").glob("*"):
                on_disk |= {p.name for p in folder.iterdir()}
        assert on_disk == kept
    finally:
        a.stop()
        b.stop()
