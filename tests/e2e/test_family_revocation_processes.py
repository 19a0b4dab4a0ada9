"""A revoked refresh family stops its access tokens at once on every process (SPEC §15):
two real `orchestra serve` processes on one PostgreSQL database share nothing but the
store and its NOTIFY signals. The reuse is detected on A; B refuses the family's access
token on the very next request, from its copy of the user table as well as without one.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.e2e

AUTH = "/api/v1/auth"
FILES = "/api/v1/adapter/client/upload"  # any USER route


def _session(server: ServerProcess, name: str) -> dict:
    answer = httpx.post(f"{server.base_url}{AUTH}/login",
                        json={"user_name": name, "password": "password-123"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _bearer(session: dict) -> dict:
    return {"Authorization": f"Bearer {session['access_token']}"}


def test_reuse_on_one_process_stops_the_familys_access_token_on_the_other(tmp_path, postgres_url):
    a = ServerProcess(tmp_path / "a", database_url=postgres_url).start()
    b = ServerProcess(tmp_path / "b", database_url=postgres_url).start()
    try:
        for name, role in (("root", "SUPER_ADMINISTRATOR"), ("alice", "USER")):
            made = a.cli("user", "create", name, "--role", role, "--password-stdin",
                         input="password-123\n")
            assert made.returncode == 0, made.stderr
        root, alice, alice_other = _session(a, "root"), _session(a, "alice"), _session(b, "alice")
        with httpx.Client(base_url=a.base_url, timeout=30) as on_a, \
                httpx.Client(base_url=b.base_url, timeout=30) as on_b:
            # B's copy of the user table is taken and then served (no store round trip).
            for _ in range(3):
                assert on_b.get(f"{AUTH}/list", headers=_bearer(root)).status_code == 200
                assert on_b.get(FILES, headers=_bearer(alice)).status_code == 200

            for session in (root, alice):
                rotated = on_a.post(f"{AUTH}/refresh", json={"refresh_token": session["refresh_token"]})
                assert rotated.status_code == 200, rotated.text
                reused = on_a.post(f"{AUTH}/refresh", json={"refresh_token": session["refresh_token"]})
                assert reused.status_code == 401 and reused.json()["error"] == "TokenInvalidError"

            refused = on_b.get(f"{AUTH}/list", headers=_bearer(root))
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"] == "TokenInvalidError"
            refused = on_b.get(FILES, headers=_bearer(alice))
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"] == "TokenInvalidError"
            assert on_a.get(FILES, headers=_bearer(alice)).status_code == 401
            # Alice's login on B is another family: it goes on, on both processes.
            assert on_b.get(FILES, headers=_bearer(alice_other)).status_code == 200
            assert on_a.get(FILES, headers=_bearer(alice_other)).status_code == 200
    finally:
        a.stop()
        b.stop()


def test_a_revocation_whose_signal_was_missed_is_read_from_the_store(tmp_path, postgres_url):
    """The revocation is written by another client just after the process's LISTEN
    connection was cut, so its signal may be lost: the process does not trust its copy
    while disconnected and reads the store again once it is back, so the family's access
    token is refused all the same, on every request."""
    import asyncio
    import time

    import asyncpg

    server = ServerProcess(tmp_path / "s", database_url=postgres_url).start()
    try:
        made = server.cli("user", "create", "root", "--role", "SUPER_ADMINISTRATOR",
                          "--password-stdin", input="password-123\n")
        assert made.returncode == 0, made.stderr
        root = _session(server, "root")
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            for _ in range(3):  # the copy is taken and served
                assert http.get(f"{AUTH}/list", headers=_bearer(root)).status_code == 200

            async def revoke_behind_its_back() -> None:
                conn = await asyncpg.connect(postgres_url)
                try:  # only this test's database: other tests' listeners are left alone
                    await conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = 'orchestra-listen' AND datname = current_database()")
                    await conn.execute(
                        "UPDATE refresh_token SET revoked = true, "
                        "access_revoked_at = now() AT TIME ZONE 'utc' "
                        "WHERE user_id = (SELECT id FROM \"user\" WHERE user_name = 'root')")
                finally:
                    await conn.close()

            asyncio.run(revoke_behind_its_back())
            deadline = time.monotonic() + 10
            statuses = []
            while time.monotonic() < deadline:  # down, then back: refused throughout
                statuses.append(http.get(f"{AUTH}/list", headers=_bearer(root)).status_code)
                if len(statuses) >= 20:
                    break
                time.sleep(0.1)
            assert set(statuses) == {401}, statuses
    finally:
        server.stop()
