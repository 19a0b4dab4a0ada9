"""Runs that ride out faults (SPEC §6), with real faults: `orchestra serve` processes on
a PostgreSQL cluster of the test's own (tests/e2e/pgcluster.py) that is restarted and
stopped mid-run, and an owner frozen with SIGSTOP past its lease. End to end: real
processes, real HTTP, the fake model server. Never touches the shared server on 5432.

ORCHESTRA_TEST_OUTAGE_SECONDS sets the long outage's length (default 8 s, past the 3 s
lease; 60 reproduces the issue's probe).
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.pgcluster import PgCluster, missing_reason
from tests.e2e.test_workflow_e2e import fake_worker, login
from tests.fakes.fake_llm import FakeLLM

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or ""),
]

LEASE = 3
OUTAGE = float(os.environ.get("ORCHESTRA_TEST_OUTAGE_SECONDS", "8"))
ENV = {"ORCHESTRA_RUN_LEASE_SECONDS": str(LEASE), "ORCHESTRA_SHUTDOWN_GRACE_SECONDS": "5"}


@pytest.fixture(scope="module")
def cluster():
    pg = PgCluster().start()
    try:
        yield pg
    finally:
        pg.remove()


@pytest.fixture
def store(cluster):
    """A fresh database on the module's cluster, its URL."""
    name = f"t{time.monotonic_ns()}"
    subprocess_db(cluster, f'CREATE DATABASE "{name}"')
    yield cluster.url.rsplit("/", 1)[0] + f"/{name}"
    if not _up(cluster):
        cluster.start_server()
    subprocess_db(cluster, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def subprocess_db(cluster: PgCluster, sql: str) -> None:
    import asyncio

    import asyncpg

    async def go() -> None:
        conn = await asyncpg.connect(cluster.url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(go())


def _up(cluster: PgCluster) -> bool:
    try:
        subprocess_db(cluster, "SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - down
        return False


class World:
    """Server processes on one store, a fake model streaming slowly, an admin's token."""

    def __init__(self, tmp_path, url: str, fake: FakeLLM, count: int) -> None:
        self.tmp_path, self.url, self.fake = tmp_path, url, fake
        self.servers = [ServerProcess(tmp_path / f"s{i}", database_url=url, env=ENV).start()
                        for i in range(count)]
        self.headers = login(self.servers[0], "admin", "ADMINISTRATOR")
        self.worker = fake_worker(self.http(0), fake)
        self.statuses: list[int] = []  # every answer the pollers got

    def http(self, i: int) -> httpx.Client:
        return httpx.Client(base_url=self.servers[i].base_url + "/api/v1",
                            headers=self.headers, timeout=30)

    def template(self, steps: list[dict]) -> str:
        made = self.http(0).post("/workflow/template", json={"name": f"t{time.monotonic_ns()}",
                                                             "steps": steps})
        assert made.status_code == 201, made.text
        return made.json()["template_id"]

    def two_steps(self) -> str:
        return self.template([
            {"id": "one", "agent": {"worker": self.worker}, "prompt": "one {{input}} a b c d e f"},
            {"id": "two", "agent": {"worker": self.worker}, "prompt": "two {{input}} g h i j k l",
             "depends_on": ["one"]},
        ])

    def start_runs(self, template_id: str, n: int) -> list[str]:
        ids = []
        for i in range(n):
            started = self.http(i % len(self.servers)).post(
                "/workflow/run", json={"template_id": template_id, "input": f"run{i}"})
            assert started.status_code == 202, started.text
            ids.append(started.json()["trace_id"])
        return ids

    def poll_until_done(self, ids: list[str], timeout: float) -> dict[str, str]:
        """Poll every run through every server until all ended; every answer is kept."""
        deadline = time.monotonic() + timeout
        status: dict[str, str] = {}
        clients = [self.http(i) for i in range(len(self.servers))]
        while time.monotonic() < deadline:
            for n, trace_id in enumerate(ids):
                if status.get(trace_id) in ("succeeded", "failed", "cancelled", "interrupted"):
                    continue
                try:
                    answer = clients[n % len(clients)].get(f"/workflow/run/{trace_id}")
                except httpx.TransportError:
                    continue
                self.statuses.append(answer.status_code)
                if answer.status_code == 200:
                    status[trace_id] = answer.json()["status"]
            if len(status) == len(ids) and all(
                    s in ("succeeded", "failed", "cancelled", "interrupted") for s in status.values()):
                return status
            time.sleep(0.2)
        raise AssertionError(f"runs not ended in {timeout}s: {status}")

    def events(self, trace_id: str) -> list[dict]:
        return self.http(0).get(f"/workflow/run/{trace_id}/events").json()["events"]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def fake():
    with FakeLLM(chunk_delay=0.15) as fake:
        yield fake


def store_log_lines(server: ServerProcess) -> list[str]:
    text = server.log_path.read_text(errors="replace")
    return [line for line in text.splitlines()
            if "store" in line.lower() or "Traceback" in line or "Error" in line]


def assert_gapless_one_end(events: list[dict]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    ends = [e for e in events if e["kind"] in ("run_finished", "run_failed", "run_cancelled")]
    assert len(ends) == 1 and ends[0] is events[-1], [e["kind"] for e in events]


def test_a_store_restart_mid_runs_costs_no_run_and_no_500(tmp_path, store, cluster, fake):
    world = World(tmp_path, store, fake, 1)
    try:
        ids = world.start_runs(world.two_steps(), 10)
        time.sleep(1.0)  # the runs are streaming
        cluster.restart()
        status = world.poll_until_done(ids, 90)
        assert list(status.values()) == ["succeeded"] * 10, status
        assert all(code < 500 or code == 503 for code in world.statuses), world.statuses
        for trace_id in ids:
            assert_gapless_one_end(world.events(trace_id))
        assert not [line for line in store_log_lines(world.servers[0]) if "Traceback" in line]
    finally:
        world.stop()


def test_a_store_outage_past_the_lease_is_waited_out_in_few_log_lines(tmp_path, store, cluster, fake):
    world = World(tmp_path, store, fake, 1)
    try:
        ids = world.start_runs(world.two_steps(), 10)
        time.sleep(1.0)
        before = len(world.servers[0].log_path.read_text(errors="replace").splitlines())
        cluster.stop_server()
        http = world.http(0)
        during: list[httpx.Response] = []
        stop_at = time.monotonic() + OUTAGE
        while time.monotonic() < stop_at:
            during.append(http.get(f"/workflow/run/{ids[0]}"))
            time.sleep(0.5)
        cluster.start_server()
        status = world.poll_until_done(ids, 120)
        assert list(status.values()) == ["succeeded"] * 10, status
        codes = {r.status_code for r in during}
        assert codes <= {200, 503}, codes
        unavailable = [r for r in during if r.status_code == 503]
        assert unavailable and all(
            r.json()["error"] == "StoreUnavailableError" and int(r.headers["Retry-After"]) > 0
            for r in unavailable)
        # The LISTEN connection retries with a backoff of up to 5 s: the runs may end first.
        deadline = time.monotonic() + 15
        while "LISTEN connection back" not in world.servers[0].log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the LISTEN connection did not come back"
            time.sleep(0.2)
        lines = world.servers[0].log_path.read_text(errors="replace").splitlines()[before:]
        noisy = [line for line in lines if "HTTP/1.1" not in line and line.strip()]
        assert len(noisy) <= 20 * max(1.0, OUTAGE / 60) + 2, "\n".join(noisy)
        assert not [line for line in noisy if "Traceback" in line], "\n".join(noisy)
        # One line when the LISTEN connection goes and one when it is back, not one per retry.
        assert sum("LISTEN connection lost" in line for line in noisy) == 1, "\n".join(noisy)
        assert sum("LISTEN connection back" in line for line in noisy) == 1, "\n".join(noisy)
        for trace_id in ids:
            assert_gapless_one_end(world.events(trace_id))
    finally:
        world.stop()


def test_a_frozen_owner_writes_nothing_after_another_process_resumed_its_run(
        tmp_path, store, fake):
    world = World(tmp_path, store, fake, 2)
    try:
        template = world.template([
            {"id": "one", "agent": {"worker": world.worker},
             "prompt": "one {{input}} a b c d e f g h i j k l m n o p q r s t"},
        ])
        owner = world.servers[0]
        started = world.http(0).post("/workflow/run", json={"template_id": template, "input": "x"})
        trace_id = started.json()["trace_id"]
        deadline = time.monotonic() + 20
        while not any(e["kind"] == "token" for e in world.events(trace_id)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        held_by = world.http(1).get(f"/workflow/run/{trace_id}").json()
        os.kill(owner.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + LEASE * 6
            while not any(e["kind"] == "run_resumed" for e in
                          world.http(1).get(f"/workflow/run/{trace_id}/events").json()["events"]):
                assert time.monotonic() < deadline, "the other process did not resume the run"
                time.sleep(0.2)
        finally:
            os.kill(owner.proc.pid, signal.SIGCONT)
        http_b = world.http(1)
        deadline = time.monotonic() + 60
        while http_b.get(f"/workflow/run/{trace_id}").json()["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(LEASE)  # the thawed owner had every chance to write
        events = http_b.get(f"/workflow/run/{trace_id}/events").json()["events"]
        assert_gapless_one_end(events)
        resumed = [e["seq"] for e in events if e["kind"] == "run_resumed"]
        assert len(resumed) == 1 and events[-1]["kind"] == "run_finished"
        assert held_by["status"] in ("running", "queued")
    finally:
        world.stop()
