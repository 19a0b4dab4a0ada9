"""The embedded SQLite store is served by one process: a second server on the same store
is refused at start with one line that names PostgreSQL, and the first keeps serving."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.conftest import ServerProcess, free_port


def serve(server: ServerProcess, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestra", "serve", "--port", str(free_port()), *extra],
        env=server.env, capture_output=True, text=True, timeout=60,
    )


def test_a_second_server_on_the_same_sqlite_store_is_refused(server):
    second = serve(server)
    assert second.returncode != 0
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, second.stderr
    assert "Another orchestra serve" in lines[0] and "PostgreSQL" in lines[0]
    assert str(server.proc.pid) in lines[0]
    # The first one is untouched, and CLI commands still write to the store meanwhile.
    made = server.cli("user", "create", "later", "--password-stdin", input="password-123\n")
    assert made.returncode == 0, made.stderr
    login = httpx.post(f"{server.base_url}/api/v1/auth/login",
                       json={"user_name": "later", "password": "password-123"})
    assert login.status_code == 200, login.text


def test_several_workers_on_sqlite_are_refused(tmp_path):
    server = ServerProcess(tmp_path / "home")
    server.home.mkdir(parents=True)
    refused = serve(server, "--workers", "2")
    assert refused.returncode == 2
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "PostgreSQL" in lines[0] and "--workers 2" in lines[0], refused.stderr


def test_the_lock_goes_with_the_process(tmp_path):
    first = ServerProcess(tmp_path / "home").start()
    first.kill()  # kill -9: the lock is released with the process
    second = ServerProcess(tmp_path / "home").start()
    try:
        assert httpx.get(f"{second.base_url}/api/v1/auth/list").status_code == 401
    finally:
        second.stop()
