"""`orchestra db prune` and `orchestra db backup`: retention by hand, and a consistent copy
of a SQLite store taken while a real server writes to it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sqlite3
import threading
from pathlib import Path

import httpx
import pytest

from orchestra.core import Core
from orchestra.db.models import RefreshToken, WorkflowRun, utcnow
from orchestra.services import auth
from tests.conftest import FAST_HASH, ServerProcess, make_settings

SECRET = "cli-secret-" + "c" * 32
PASSWORD = "password-123"


@pytest.fixture
def env(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    return {
        "ORCHESTRA_HOME": str(home),
        "ORCHESTRA_DATABASE_URL": f"sqlite:///{home / 'orchestra.db'}",
        "ORCHESTRA_SECRET_KEY": SECRET,
        "COLUMNS": "200",
        **{f"ORCHESTRA_{k.upper()}": str(v) for k, v in FAST_HASH.items()},
    }


def store(env: dict, fn):
    async def go():
        settings = make_settings(Path(env["ORCHESTRA_HOME"]), env["ORCHESTRA_DATABASE_URL"], secret_key=SECRET)
        core = await Core.open(settings)
        try:
            return await fn(core)
        finally:
            await core.close()

    return asyncio.run(go())


async def seed(core: Core) -> None:
    owner = (await auth.register(core, user_name="alice", password=PASSWORD)).id
    now = utcnow()
    for name, finished in (("ended-long-ago", now - dt.timedelta(days=31)),
                           ("ended-lately", now - dt.timedelta(days=29)), ("running", None)):
        await WorkflowRun.acreate(trace_id=name, owner=owner, template_name="t", steps=[],
                                  status="running" if finished is None else "succeeded", finished_at=finished)
    await RefreshToken.acreate(jti="old", family="f", user=owner, expires_at=now - dt.timedelta(hours=1))


async def run_ids(core: Core) -> set[str]:
    return {r.trace_id for r in await core.db.list(WorkflowRun.select())}


def test_prune_by_hand(cli, env):
    store(env, seed)
    done = cli("db", "prune", "--older-than", "30d", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"runs": 1, "refresh_tokens": 1}
    assert store(env, run_ids) == {"ended-lately", "running"}
    done = cli("db", "prune", "--older-than", "0d")
    assert done.exit_code == 0, done.output
    assert store(env, run_ids) == {"running"}


@pytest.mark.parametrize("age", ["30", "1w", "-1d", "soon"])
def test_prune_refuses_an_age_it_cannot_read(cli, env, age):
    store(env, seed)
    done = cli("db", "prune", "--older-than", age)
    assert done.exit_code == 2
    assert "--older-than" in done.stderr and "30d" in done.stderr
    assert store(env, run_ids) == {"ended-long-ago", "ended-lately", "running"}


def test_backup_of_postgresql_points_to_pg_dump(cli, env):
    done = cli("--db", "postgresql://postgres@127.0.0.1:5432/anything", "db", "backup", "/tmp/x.db")
    assert done.exit_code == 2
    assert "pg_dump" in done.stderr


def test_backup_refuses_to_overwrite(cli, env, tmp_path):
    store(env, seed)
    target = tmp_path / "copy.db"
    target.write_text("keep me")
    done = cli("db", "backup", str(target))
    assert done.exit_code == 2 and "already exists" in done.stderr
    assert target.read_text() == "keep me"


@pytest.mark.e2e
def test_backup_while_the_server_writes(tmp_path):
    """Users are registered without pause while the copy is taken: the copy is a sound
    store holding every user registered before it started and none half-written."""
    server = ServerProcess(tmp_path / "home").start()
    stop = threading.Event()
    registered: list[str] = []

    def write() -> None:
        with httpx.Client(base_url=f"{server.base_url}/api/v1") as http:
            n = 0
            while not stop.is_set():
                name = f"user{n:05d}"
                answer = http.post("/auth/register", json={"user_name": name, "password": PASSWORD})
                assert answer.status_code == 201, answer.text
                registered.append(name)
                n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        while len(registered) < 20 and writer.is_alive():  # writes in flight before the copy
            stop.wait(0.05)
        assert writer.is_alive(), "the writer stopped"
        before = len(registered)
        target = tmp_path / "backup" / "copy.db"
        target.parent.mkdir()
        done = server.cli("db", "backup", str(target))
        after = len(registered)
    finally:
        stop.set()
        writer.join()
        server.stop()
    assert done.returncode == 0, done.stderr
    assert "copied the store" in done.stderr
    assert [p.name for p in target.parent.iterdir()] == ["copy.db"]  # no temporary left
    with sqlite3.connect(target) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        names = {row[0] for row in copy.execute("SELECT user_name FROM user")}
    # one writer, one user at a time: a consistent copy holds exactly the first k of them,
    # at least those answered before the copy began, at most one not yet answered after it
    assert sorted(names) == [f"user{i:05d}" for i in range(len(names))]
    assert before <= len(names) <= after + 1
    # the copy is a store orchestra opens as it is
    listed = server.cli("--db", f"sqlite:///{target}", "user", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {u["user_name"] for u in json.loads(listed.stdout)} == names
