"""Careless and hostile stream readers against a real server, on SQLite and PostgreSQL:
readers that never read hold no store connection and little memory, and cannot slow
anyone else down; a run whose task crashes still ends with a stored terminal event.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import statistics
import threading
import time

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login, sse_frames
from tests.fakes.fake_llm import FakeLLM

BIG_INPUT = "a" * 900_000
BIG_OUTPUT = "b" * 900_000
STEPS = 4  # each step stores ~2.7 MB of events (prompt, tokens, output): > 10 MB in all


@pytest.fixture(params=["sqlite", "postgres"])
def store(request) -> str | None:
    return None if request.param == "sqlite" else request.getfixturevalue("postgres_url")


@pytest.fixture
def live(tmp_path, store):
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home", database_url=store,
                               env={"ORCHESTRA_SSE_SEND_TIMEOUT": "30"}).start()
        try:
            yield server, fake
        finally:
            server.stop()


def big_run_template(http: httpx.Client, fake: FakeLLM) -> str:
    provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                            "model_id": "m", "api_key": "k", "base_url": fake.base_url})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "echo", "provider_id": provider.json()["provider_id"],
                                              "tools": []}).json()["worker_id"]
    steps = [{"id": f"s{i}", "agent": {"worker": worker}, "prompt": "{{input}}",
              "depends_on": [f"s{i - 1}"] if i else []} for i in range(STEPS)]
    template = http.post("/workflow/template", json={"name": "big", "steps": steps})
    assert template.status_code == 201, template.text
    for _ in range(STEPS):
        fake.script_text(BIG_OUTPUT, chunks=4)
    return template.json()["template_id"]


def non_reader(port: int, path: str, token: str) -> socket.socket:
    """A client that asks for the stream with a tiny receive buffer and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    return sock


def test_non_reading_stream_clients_cannot_starve_other_users(live):
    server, fake = live
    admin = login(server, "admin", "ADMINISTRATOR")
    http = httpx.Client(base_url=server.base_url + "/api/v1", headers=admin, timeout=30)
    template = big_run_template(http, fake)
    trace_id = http.post("/workflow/run", json={"template_id": template, "input": BIG_INPUT}).json()["trace_id"]
    token = admin["Authorization"].split()[1]
    stuck = [non_reader(server.port, f"/api/v1/workflow/sse/{trace_id}", token) for _ in range(20)]
    try:
        other = login(server, "bystander")
        bystander = httpx.Client(base_url=server.base_url + "/api/v1", headers=other, timeout=30)
        timings, statuses = [], []
        for i in range(50):
            path = ("/workflow/template", "/workflow/run", "/resource/tool", "/agent/worker")[i % 4]
            began = time.monotonic()
            response = bystander.get(path)
            timings.append(time.monotonic() - began)
            statuses.append(response.status_code)
        assert statuses == [200] * 50
        p99 = statistics.quantiles(timings, n=100)[98]
        assert p99 < 1.0, f"p99 {p99:.3f}s"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            run = http.get(f"/workflow/run/{trace_id}").json()
            if run["status"] not in ("queued", "running"):
                break
            time.sleep(0.2)
        assert run["status"] == "succeeded", run
        events = http.get(f"/workflow/run/{trace_id}/events").json()["events"]
        stored_bytes = sum(len(str(e["data"])) for e in events)
        assert stored_bytes > 10_000_000
        # A reader that does read gets the whole run, every event once, in order.
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            frames = list(sse_frames(response))
        assert [f[0] for f in frames] == [e["seq"] for e in events]
    finally:
        for sock in stuck:
            sock.close()


def test_a_reader_that_takes_nothing_is_disconnected_after_the_send_timeout(tmp_path):
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_SSE_SEND_TIMEOUT": "2"}).start()
        try:
            admin = login(server, "admin", "ADMINISTRATOR")
            http = httpx.Client(base_url=server.base_url + "/api/v1", headers=admin, timeout=30)
            template = big_run_template(http, fake)
            trace_id = http.post("/workflow/run", json={"template_id": template,
                                                        "input": BIG_INPUT}).json()["trace_id"]
            sock = non_reader(server.port, f"/api/v1/workflow/sse/{trace_id}", admin["Authorization"][7:])
            time.sleep(6)  # the server stopped waiting for this reader after ~2 s
            sock.settimeout(10)
            received = 0
            try:
                while chunk := sock.recv(1 << 20):
                    received += len(chunk)
            except ConnectionResetError:
                pass  # dropped: also what a send timeout may look like
            sock.close()
            assert received < 10_000_000  # far less than the whole run: the server hung up
        finally:
            server.stop()


def slow_run_being_read(server: ServerProcess, fake: FakeLLM, words: int):
    """A one-step run streaming `words` words 0.1 s apart, read by a thread into `frames`;
    returns (http, trace_id, frames, reader) once the first token has arrived."""
    admin = login(server, "admin", "ADMINISTRATOR")
    http = httpx.Client(base_url=server.base_url + "/api/v1", headers=admin, timeout=60)
    provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                            "model_id": "m", "api_key": "k",
                                            "base_url": fake.base_url}).json()["provider_id"]
    worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider,
                                              "tools": []}).json()["worker_id"]
    template = http.post("/workflow/template", json={"name": "slow", "steps": [
        {"id": "s", "agent": {"worker": worker}, "prompt": "go"}]}).json()["template_id"]
    fake.script_text("word " * words, chunks=words, delay=0.1)
    trace_id = http.post("/workflow/run", json={"template_id": template}).json()["trace_id"]
    frames: list = []

    def read() -> None:
        with http.stream("GET", f"/workflow/sse/{trace_id}") as response:
            frames.extend(sse_frames(response))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while not any(f[1] == "token" for f in frames):
        assert time.monotonic() < deadline, "no token within 10 s"
        time.sleep(0.05)
    return http, trace_id, frames, reader


def test_a_crashed_run_task_still_ends_with_a_terminal_event(tmp_path, store):
    """The store fails under a running step, not by an outage (the event table is away
    for a few seconds): the run ends `failed`, with the reason in a stored `run_failed`,
    and its stream ends."""
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home", database_url=store).start()
        try:
            http, trace_id, frames, reader = slow_run_being_read(server, fake, 200)
            if store is None:
                hide_the_sqlite_event_table(server.home / "orchestra.db", seconds=4)
            else:
                asyncio.run(hide_the_event_table(store, seconds=4))
            reader.join(90)
            assert frames and frames[-1][1] == "run_failed", [f[1] for f in frames][-5:]
            assert frames[-1][2]["status"] == "failed" and frames[-1][2]["error"]
            assert [f[0] for f in frames] == list(range(1, len(frames) + 1))
            run = http.get(f"/workflow/run/{trace_id}").json()
            assert run["status"] == "failed" and run["error"] == frames[-1][2]["error"]
        finally:
            server.stop()


BUSY_TIMEOUT = 1.5  # seconds (ORCHESTRA_DB_BUSY_TIMEOUT; 10 by default)


def test_a_sqlite_store_locked_past_its_busy_timeout_is_waited_out(tmp_path):
    """Another program holds the SQLite file locked for longer than the store's busy
    timeout (ORCHESTRA_DB_BUSY_TIMEOUT, set short here) under a running step: that is an
    outage (SPEC §6), so the run waits and then succeeds, and its stream is whole and in
    order."""
    with FakeLLM() as fake:
        server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_DB_BUSY_TIMEOUT": str(BUSY_TIMEOUT)}).start()
        try:
            http, trace_id, frames, reader = slow_run_being_read(server, fake, 100)
            locker = sqlite3.connect(server.home / "orchestra.db", timeout=30)
            locker.execute("BEGIN EXCLUSIVE")
            time.sleep(BUSY_TIMEOUT + 2.5)  # past the store's busy timeout: writes fail meanwhile
            locker.rollback()
            locker.close()
            reader.join(90)
            assert frames and frames[-1][1] == "run_finished", [f[1] for f in frames][-5:]
            assert frames[-1][2]["status"] == "succeeded"
            assert [f[0] for f in frames] == list(range(1, len(frames) + 1))
            assert "".join(f[2]["text"] for f in frames if f[1] == "token") == "word " * 100
            run = http.get(f"/workflow/run/{trace_id}").json()
            assert run["status"] == "succeeded" and run["error"] is None
            assert "run_resumed" not in [f[1] for f in frames]  # waited out in place, not taken over
            log = server.log_path.read_text()  # the lock outlived the busy timeout: an outage
            assert "the store is unreachable" in log and "the store is reachable again" in log, log[-3000:]
        finally:
            server.stop()


def hide_the_sqlite_event_table(path, *, seconds: float) -> None:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("ALTER TABLE run_event RENAME TO run_event_away")
        time.sleep(seconds)
        conn.execute("ALTER TABLE run_event_away RENAME TO run_event")
    finally:
        conn.close()


async def hide_the_event_table(url: str, *, seconds: float) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("ALTER TABLE run_event RENAME TO run_event_away")
        await asyncio.sleep(seconds)
        await conn.execute("ALTER TABLE run_event_away RENAME TO run_event")
    finally:
        await conn.close()
