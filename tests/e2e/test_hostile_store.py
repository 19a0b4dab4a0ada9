"""Clients that could hurt the store for everyone, against a real `orchestra serve`
process on SQLite and on PostgreSQL (issue 7, items 2, 7, 10, 11 and 12).

- A request cancelled (its client hangs up) while its write transaction waits for a
  lock leaves no lock behind: other clients' writes succeed at once, nothing of it is
  committed.
- A server killed with `kill -9` mid-upload leaves no temp file after a restart; a
  live upload of another process sharing the folder is never swept.
- A demoted administrator's old token is refused at once on administrator routes.
- Slow uploads and slow provider checks hold no pooled store connection: another
  user's requests are answered at once while 20 of them are in flight.
- 20 concurrent creates of one name in mixed case give one 201 and 19 × 409, for
  templates, skills, providers and workers; the store's unique index decides.
- Migration 0002 renames names that collide without regard to case in an old store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import json
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

import httpx
import pytest

from tests.conftest import ServerProcess

API = "/api/v1"
PASSWORD = "password-123"
HUMAN_STEPS = [{"id": "ask", "agent": {"human": True}, "prompt": "Go?", "depends_on": []}]
SAME = ["Same", "same", "SAME", "sAmE", "ＳＡＭＥ"]  # the last in full width: NFKC folds it


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'orchestra.db'}"
    return request.getfixturevalue("blank_postgres_url")  # migrated by the server, or by the test


class World:
    """A started server plus helpers to make users and talk to it."""

    def __init__(self, server: ServerProcess, store_url: str) -> None:
        self.server = server
        self.store_url = store_url

    @property
    def base(self) -> str:
        return self.server.base_url + API

    def user(self, name: str, role: str = "USER") -> dict:
        made = self.server.cli("user", "create", name, "--role", role, "--password-stdin",
                               input=PASSWORD + "\n")
        assert made.returncode == 0, made.stderr
        return self.login(name)

    def login(self, name: str) -> dict:
        answer = httpx.post(f"{self.base}/auth/login", json={"user_name": name, "password": PASSWORD},
                            timeout=30)
        assert answer.status_code == 200, answer.text
        token = answer.json()["access_token"]
        return {"token": token, "headers": {"Authorization": f"Bearer {token}"}}

    def client(self, who: dict) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=who["headers"], timeout=30)


@pytest.fixture
def world(tmp_path, store_url):
    server = ServerProcess(tmp_path / "home", database_url=store_url).start()
    yield World(server, store_url)
    server.stop()


def _ordinary_requests(client: httpx.Client, count: int) -> list[float]:
    """`count` ordinary store-backed requests, one after another; each one's seconds."""
    times = []
    for i in range(count):
        started = time.monotonic()
        answer = client.get("/workflow/template") if i % 2 else client.get("/agent/worker")
        times.append(time.monotonic() - started)
        assert answer.status_code == 200, answer.text
    return times


# --- item 2: a request that fails inside a transaction ---------------------------------


class _StoreLock:
    """Another store client holding a lock the server's next write will wait for:
    SQLite's write lock, or (PostgreSQL) the row lock of one user."""

    def __init__(self, store_url: str, user_id: str) -> None:
        self.store_url, self.user_id = store_url, user_id

    def __enter__(self) -> Self:
        if self.store_url.startswith("sqlite"):
            self.conn = sqlite3.connect(self.store_url.split(":///", 1)[1], isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            import asyncpg

            self.loop = asyncio.new_event_loop()
            self.conn = self.loop.run_until_complete(asyncpg.connect(self.store_url))
            self.tx = self.conn.transaction()
            self.loop.run_until_complete(self.tx.start())
            self.loop.run_until_complete(
                self.conn.execute('SELECT 1 FROM "user" WHERE id = $1 FOR UPDATE', self.user_id)
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.store_url.startswith("sqlite"):
            self.conn.execute("ROLLBACK")
            self.conn.close()
        else:
            self.loop.run_until_complete(self.tx.rollback())
            self.loop.run_until_complete(self.conn.close())
            self.loop.close()


def test_a_request_cancelled_inside_its_transaction_leaves_no_lock(world):
    root = world.user("root", "SUPER_ADMINISTRATOR")
    world.user("bob")
    alice = world.user("alice")
    users = world.client(root).get("/auth/list").json()["users"]
    bob_id = next(u["user_id"] for u in users if u["user_name"] == "bob")
    body = json.dumps({"user_id": bob_id, "new_authority": "ADMINISTRATOR"}).encode()
    head = (f"PUT {API}/auth/authority HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {root['token']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()

    with _StoreLock(world.store_url, bob_id):
        sock = socket.create_connection(("127.0.0.1", world.server.port))
        sock.sendall(head + body)  # its transaction now waits for the lock
        time.sleep(1.0)
        sock.close()  # the client hangs up: the server cancels the request
        time.sleep(0.5)
    time.sleep(0.5)  # whatever the cancelled request left running has finished by now

    # Sixteen writes, each on a new connection, cycle through every pooled connection:
    # a connection left inside a transaction would make one of them wait for the lock
    # ("database is locked"), or swallow its write in a transaction later rolled back.
    names = [f"after-{i}" for i in range(16)]
    for name in names:
        started = time.monotonic()
        with world.client(alice) as fresh:
            made = fresh.post("/workflow/template", json={"name": name, "steps": HUMAN_STEPS})
        assert made.status_code == 201, made.text
        assert time.monotonic() - started < 1.0
    with world.client(alice) as fresh:
        listed = fresh.get("/workflow/template").json()["templates"]
    assert sorted(t["name"] for t in listed) == sorted(names)
    users = world.client(root).get("/auth/list").json()["users"]
    assert next(u["role"] for u in users if u["user_name"] == "bob") == "USER"  # rolled back


# --- item 7: uploads interrupted by kill -9 --------------------------------------------


REST = 1024 * 1024
TRAILER = b"\r\n--hostileboundary--\r\n"


def _start_upload(port: int, token: str, first_bytes: int) -> socket.socket:
    """A multipart upload that sends `first_bytes` of a file and then waits: the rest
    (REST more bytes, then TRAILER) is the caller's to send, or never sent."""
    boundary = "hostileboundary"
    preamble = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port))
    total = len(preamble) + first_bytes + REST + len(TRAILER)
    sock.sendall((f"POST {API}/adapter/client/upload HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {token}\r\n"
                  f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                  f"Content-Length: {total}\r\n\r\n").encode() + preamble + b"x" * first_bytes)
    return sock


def _parts(uploads: Path) -> list[Path]:
    return sorted(uploads.glob("*/.*.part"))


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_kill_during_an_upload_leaves_nothing_after_restart(world):
    uploads = world.server.home / "uploads"
    bob = world.user("bob")
    sock = _start_upload(world.server.port, bob["token"], 200_000)
    _wait_for(lambda: len(_parts(uploads)) == 1)
    (user_dir,) = [p for p in uploads.iterdir() if p.is_dir()]
    world.server.kill()
    sock.close()
    assert len(_parts(uploads)) == 1  # what a killed process leaves

    world.server.start()
    assert _parts(uploads) == []
    assert not user_dir.exists()  # the folder was left empty, so it went too
    listed = world.client(world.login("bob")).get("/adapter/client/upload")
    assert listed.status_code == 200 and listed.json()["files"] == []


def test_the_start_up_sweep_spares_a_live_upload_of_another_process(tmp_path, sqlite_url):
    """Two server processes share one uploads folder, as the workers of one service
    do. The sweep depends only on the folder; the second server gets a store of its
    own because one SQLite store takes one server process."""
    world = World(ServerProcess(tmp_path / "home", database_url=sqlite_url).start(), sqlite_url)
    bob = world.user("bob")
    uploads = world.server.home / "uploads"
    sock = _start_upload(world.server.port, bob["token"], 200_000)
    _wait_for(lambda: len(_parts(uploads)) == 1)
    second = ServerProcess(world.server.home,
                           database_url=f"sqlite:///{tmp_path / 'second' / 'orchestra.db'}").start()
    try:
        assert len(_parts(uploads)) == 1  # locked by the first server: still there
        sock.sendall(b"y" * REST + TRAILER)
        sock.settimeout(10)
        answer = sock.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 201"), answer
        files = world.client(world.login("bob")).get("/adapter/client/upload").json()["files"]
        assert [f["size"] for f in files] == [200_000 + REST]
    finally:
        sock.close()
        second.stop()
        world.server.stop()


# --- item 10: a demotion takes effect at once -------------------------------------------


def test_a_demoted_administrator_is_refused_at_once_with_the_old_token(world):
    root = world.client(world.user("root", "SUPER_ADMINISTRATOR"))
    admin = world.user("adam", "ADMINISTRATOR")
    adam = world.client(admin)
    provider = {"name": "p", "provider": "openai_compatible", "model_id": "m",
                "base_url": "http://127.0.0.1:9/v1"}
    assert adam.post("/provider", json=provider).status_code == 201
    assert adam.post("/agent/reload").status_code == 200
    assert adam.get("/workflow/run", params={"all": "1"}).status_code == 200

    users = root.get("/auth/list").json()["users"]
    adam_id = next(u["user_id"] for u in users if u["user_name"] == "adam")
    demoted = root.put("/auth/authority", json={"user_id": adam_id, "new_authority": "USER"})
    assert demoted.status_code == 200, demoted.text

    refused = [
        adam.post("/provider", json={**provider, "name": "q"}),
        adam.post("/agent/reload"),
        adam.get("/workflow/run", params={"all": "1"}),
        adam.put("/agent/node/planner", json={"model": "m"}),
    ]
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"] == "PermissionDeniedError"
    assert adam.get("/workflow/run").status_code == 200  # still a USER
    assert [p["name"] for p in root.get("/provider").json()["providers"]] == ["p"]


# --- item 11: slow bodies and slow providers hold no store connection -------------------


class _SlowModels(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible `/models` that answers after `delay` seconds."""

    delay = 4.0

    def do_GET(self) -> None:
        time.sleep(self.delay)
        body = json.dumps({"object": "list", "data": [{"id": "slow-model", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def slow_models():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowModels)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _trickled_upload(port: int, token: str, seconds: float) -> str:
    """One upload whose body arrives a few bytes at a time over `seconds`."""
    boundary = "trickle"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"t.txt\"\r\n"
            f"Content-Type: text/plain\r\n\r\n{'z' * 40}\r\n--{boundary}--\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall((f"POST {API}/adapter/client/upload HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {token}\r\n"
                      f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n").encode())
        pieces = [body[i:i + 8] for i in range(0, len(body), 8)]
        for piece in pieces:
            time.sleep(seconds / len(pieces))
            sock.sendall(piece)
        sock.settimeout(30)
        return sock.recv(65536).decode()


def test_slow_uploads_and_slow_provider_checks_do_not_starve_other_users(world, slow_models):
    admin = world.user("admin", "ADMINISTRATOR")
    uploader = world.user("uploader")
    carol = world.client(world.user("carol"))
    adm = world.client(admin)
    made = adm.post("/provider", json={"name": "slow", "provider": "openai_compatible",
                                       "model_id": "slow-model", "base_url": slow_models, "api_key": "k"})
    assert made.status_code == 201, made.text
    provider_id = made.json()["provider_id"]

    def check() -> httpx.Response:
        with world.client(admin) as c:
            return c.post(f"/provider/{provider_id}/check")

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        uploads = [pool.submit(_trickled_upload, world.server.port, uploader["token"], 5.0)
                   for _ in range(10)]
        checks = [pool.submit(check) for _ in range(10)]
        time.sleep(1.5)  # all 20 are in flight: bodies trickling, providers thinking
        times = _ordinary_requests(carol, 20)
        answers = [f.result() for f in uploads]
        checked = [f.result() for f in checks]
    assert max(times) < 1.0, f"slowest ordinary request took {max(times):.2f}s"
    assert all(a.startswith("HTTP/1.1 201") for a in answers), answers[0]
    assert [c.status_code for c in checked] == [200] * 10, checked[0].text
    assert checked[0].json()["models"] == ["slow-model"]


# --- item 12: one name, whatever its case ---------------------------------------------


def _race(make, count: int = 20) -> list[httpx.Response]:
    barrier = threading.Barrier(count)

    def one(i: int) -> httpx.Response:
        barrier.wait()
        return make(SAME[i % len(SAME)])

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def _one_winner(answers: list[httpx.Response]) -> dict:
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] + [409] * 19, [a.text for a in answers if a.status_code not in (201, 409)]
    for answer in answers:
        if answer.status_code == 409:
            assert answer.json()["error"] == "ConflictError"
    return next(a.json() for a in answers if a.status_code == 201)


def test_concurrent_creates_of_one_name_in_any_case_give_exactly_one(world):
    admin = world.user("admin", "ADMINISTRATOR")
    dave = world.user("dave")
    clients = [world.client(admin) for _ in range(20)]
    own = [world.client(dave) for _ in range(20)]
    counter = iter(range(1000))

    def post(pool, path, body):
        return pool[next(counter) % 20].post(path, json=body)

    provider = _one_winner(_race(lambda n: post(clients, "/provider", {
        "name": n, "provider": "openai_compatible", "model_id": "m", "base_url": "http://127.0.0.1:9/v1"})))
    skill = _one_winner(_race(lambda n: post(clients, "/resource/skill", {"name": n})))
    template = _one_winner(_race(lambda n: post(own, "/workflow/template", {"name": n, "steps": HUMAN_STEPS})))
    worker = _one_winner(_race(lambda n: post(own, "/agent/worker", {
        "name": n, "provider_id": provider["provider_id"]})))

    adm, mine = clients[0], own[0]
    assert len(adm.get("/provider").json()["providers"]) == 1
    assert len(adm.get("/resource/skill").json()["skills"]) == 1
    assert len(mine.get("/workflow/template").json()["templates"]) == 1
    assert len(mine.get("/agent/worker").json()["workers"]) == 1

    # Renames are held to the same rule; another owner may use the name.
    other = adm.post("/resource/skill", json={"name": "other"}).json()
    renamed = adm.put(f"/resource/skill/{other['skill_id']}", json={"name": "sAME"})
    assert renamed.status_code == 409 and renamed.json()["error"] == "ConflictError"
    second = mine.post("/workflow/template", json={"name": "second", "steps": HUMAN_STEPS}).json()
    renamed = mine.put(f"/workflow/template/{second['template_id']}",
                       json={"name": "same", "steps": HUMAN_STEPS})
    assert renamed.status_code == 409, renamed.text
    theirs = world.client(world.user("erin"))
    assert theirs.post("/workflow/template", json={"name": "SAME", "steps": HUMAN_STEPS}).status_code == 201
    assert theirs.post("/agent/worker", json={"name": "same", "provider_id": provider["provider_id"]}
                       ).status_code == 201
    assert template["template"]["name"] in SAME and worker["name"] in SAME
    assert skill["name"] in SAME and provider["name"] in SAME
    # 80 requests failed inside the store; another user's requests are served at once.
    assert max(_ordinary_requests(theirs, 10)) < 1.0


# --- item 12: what the migration does with an old store's duplicates -------------------

_OLD_STORE = """
import asyncio, sys
from argon2 import PasswordHasher
from playhouse.migrations import Runner
from orchestra.db import migrate
from orchestra.db.database import connect

async def main(url):
    db = connect(url)
    await db.run(lambda: Runner(db, directory=str(migrate.MIGRATIONS_DIR)).up(target="0001_initial"))
    password_hash = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash("password-123")
    await db.aexecute_sql(
        "INSERT INTO \\"user\\" VALUES ('u1', 'olga', 'olga', %s, 'USER', '2024-01-01 00:00:00')"
        .replace("%s", db.param), (password_hash,))
    statements = [
        "INSERT INTO provider (id, name, kind, model_id, created_at) VALUES"
        " ('p1', 'Main', 'openai', 'm', '2024-01-01 00:00:01'),"
        " ('p2', 'main', 'openai', 'm', '2024-01-01 00:00:02'),"
        " ('p3', 'MAIN', 'openai', 'm', '2024-01-01 00:00:03')",
        "INSERT INTO skill (id, name, description, instructions, created_at, updated_at) VALUES"
        " ('s1', 'Write', '', '', '2024-01-01 00:00:01', '2024-01-01 00:00:01'),"
        " ('s2', 'write', '', '', '2024-01-01 00:00:02', '2024-01-01 00:00:02')",
        "INSERT INTO worker (id, owner_id, name, description, system_prompt, provider_id, tools,"
        " bound_skill, created_at, updated_at) VALUES"
        " ('w1', 'u1', 'Bot', '', '', 'p1', '[]', 'write', '2024-01-01 00:00:01', '2024-01-01 00:00:01'),"
        " ('w2', 'u1', 'bot', '', '', 'p1', '[]', NULL, '2024-01-01 00:00:02', '2024-01-01 00:00:02')",
        "INSERT INTO workflow_template (id, owner_id, name, description, steps, shared, created_at,"
        " updated_at) VALUES"
        " ('t1', 'u1', 'Daily', '', '[]', false, '2024-01-01 00:00:01', '2024-01-01 00:00:01'),"
        " ('t2', 'u1', 'daily (2)', '', '[]', false, '2024-01-01 00:00:02', '2024-01-01 00:00:02'),"
        " ('t3', 'u1', 'DAILY', '', '[]', false, '2024-01-01 00:00:03', '2024-01-01 00:00:03')",
    ]
    for statement in statements:
        await db.aexecute_sql(statement)
    await db.close_pool()

asyncio.run(main(sys.argv[1]))
"""


def test_the_migration_renames_later_duplicates_in_an_old_store(tmp_path, store_url):
    made = subprocess.run([sys.executable, "-c", _OLD_STORE, store_url], check=False,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    server = ServerProcess(tmp_path / "home", database_url=store_url).start()
    try:
        world = World(server, store_url)
        root = world.client(world.user("root", "SUPER_ADMINISTRATOR"))
        names = sorted(p["name"] for p in root.get("/provider").json()["providers"])
        assert names == ["MAIN (3)", "Main", "main (2)"]
        skills = {s["skill_id"]: s["name"] for s in root.get("/resource/skill").json()["skills"]}
        assert skills == {"s1": "Write", "s2": "write (2)"}
        olga = world.client(world.login("olga"))
        workers = {w["worker_id"]: (w["name"], w["bound_skill"]) for w in olga.get("/agent/worker").json()["workers"]}
        assert workers == {"w1": ("Bot", "write (2)"), "w2": ("bot (2)", None)}
        templates = {t["template_id"]: t["name"] for t in olga.get("/workflow/template").json()["templates"]}
        assert templates == {"t1": "Daily", "t2": "daily (2)", "t3": "DAILY (3)"}
        assert "duplicate name 'main' renamed to 'main (2)'" in server.log_path.read_text()
    finally:
        server.stop()
