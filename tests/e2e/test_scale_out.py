"""Two real `orchestra serve` processes on one PostgreSQL database, as two hosts behind a
load balancer: any process serves any run's stream, replies and cancels; changes made
on one are used by the other; a dead or stopping owner's runs are resumed by the other.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login, sse_frames
from tests.fakes.fake_llm import FakeLLM

LEASE = 3  # seconds: short, so a dead owner's runs move on quickly in these tests


class Pair:
    """Servers A and B on one database, a fake model, an administrator's clients."""

    def __init__(self, tmp_path, database_url: str, fake: FakeLLM, env: dict | None = None) -> None:
        self.env = {"ORCHESTRA_RUN_LEASE_SECONDS": str(LEASE), "ORCHESTRA_SHUTDOWN_GRACE_SECONDS": "5",
                    **(env or {})}
        self.database_url = database_url
        self.tmp_path = tmp_path
        self.fake = fake
        self.a = ServerProcess(tmp_path / "a", database_url=database_url, env=self.env).start()
        self.b = ServerProcess(tmp_path / "b", database_url=database_url, env=self.env).start()
        self.headers = login(self.a, "admin", "ADMINISTRATOR")
        self.http_a = self.client(self.a)
        self.http_b = self.client(self.b)

    def client(self, server: ServerProcess) -> httpx.Client:
        return httpx.Client(base_url=server.base_url + "/api/v1", headers=self.headers, timeout=20)

    def restart(self, name: str) -> ServerProcess:
        server = ServerProcess(self.tmp_path / f"{name}-again", database_url=self.database_url,
                               env=self.env).start()
        setattr(self, name, server)
        setattr(self, f"http_{name}", self.client(server))
        return server

    def stop(self) -> None:
        for server in (self.a, self.b):
            server.stop()

    def provider_and_worker(self, http: httpx.Client, name: str = "fake", base_url: str | None = None):
        provider = http.post("/provider", json={
            "name": name, "provider": "openai_compatible", "model_id": "fake-model",
            "api_key": "k", "base_url": base_url or self.fake.base_url})
        assert provider.status_code == 201, provider.text
        worker = http.post("/agent/worker", json={
            "name": f"w-{name}", "provider_id": provider.json()["provider_id"], "tools": []})
        assert worker.status_code == 201, worker.text
        return provider.json()["provider_id"], worker.json()["worker_id"]

    def template(self, http: httpx.Client, steps: list[dict], name: str = "t") -> str:
        made = http.post("/workflow/template", json={"name": name, "steps": steps})
        assert made.status_code == 201, made.text
        return made.json()["template_id"]

    def run(self, http: httpx.Client, template_id: str, input: str = "go") -> str:
        started = http.post("/workflow/run", json={"template_id": template_id, "input": input})
        assert started.status_code == 202, started.text
        return started.json()["trace_id"]


def wait_for(predicate, timeout: float, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s")


def stored(http: httpx.Client, trace_id: str) -> list[tuple[int, str, dict]]:
    events = http.get(f"/workflow/run/{trace_id}/events").json()["events"]
    return [(e["seq"], e["kind"], e["data"]) for e in events]


class Reader(threading.Thread):
    """Reads one run's stream from a server into `frames`, with arrival times."""

    def __init__(self, http: httpx.Client, trace_id: str, after: int = 0) -> None:
        super().__init__(daemon=True)
        self.http, self.trace_id, self.after = http, trace_id, after
        self.frames: list[tuple[int, str, dict]] = []
        self.arrived: dict[str, float] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            headers = {"Last-Event-ID": str(self.after)} if self.after else {}
            with self.http.stream("GET", f"/workflow/sse/{self.trace_id}", headers=headers) as response:
                for frame in sse_frames(response):
                    self.frames.append(frame)
                    self.arrived.setdefault(frame[1], time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_a_run_started_on_a_streams_live_on_b(pair):
    _, worker = pair.provider_and_worker(pair.http_a)
    pair.fake.script_text("first answer in several words", chunks=6, delay=0.05)
    pair.fake.script_text("second answer in several words", chunks=6, delay=0.05)
    template = pair.template(pair.http_a, [
        {"id": "one", "agent": {"worker": worker}, "prompt": "{{input}}"},
        {"id": "two", "agent": {"worker": worker}, "prompt": "{{steps.one.output}}", "depends_on": ["one"]},
    ])
    trace_id = pair.run(pair.http_a, template)
    on_b = Reader(pair.http_b, trace_id)
    on_b.start()
    on_b.join(30)
    assert on_b.error is None and on_b.frames
    assert [f[0] for f in on_b.frames] == list(range(1, len(on_b.frames) + 1))
    assert on_b.frames[-1][1] == "run_finished"
    assert on_b.frames == stored(pair.http_a, trace_id)


def test_a_reply_and_a_cancel_sent_to_b_reach_a_within_a_second(pair):
    template = pair.template(pair.http_a, [
        {"id": "ask", "agent": {"human": True}, "prompt": "Name?"},
        {"id": "again", "agent": {"human": True}, "prompt": "Sure, {{steps.ask.output}}?",
         "depends_on": ["ask"]},
    ])
    trace_id = pair.run(pair.http_a, template)
    on_a = Reader(pair.http_a, trace_id)
    on_a.start()
    wait_for(lambda: "reply_requested" in on_a.arrived, 10)
    request = next(f[2] for f in on_a.frames if f[1] == "reply_requested")
    sent = time.monotonic()
    answered = pair.http_b.post(f"/workflow/reply/{trace_id}",
                                json={"content": "Ada", "request_id": request["request_id"]})
    assert answered.status_code == 200, answered.text
    # A's run goes on (it asks the next question) and A's reader sees the reply at once.
    wait_for(lambda: sum(1 for f in on_a.frames if f[1] == "reply_requested") == 2, 5)
    assert on_a.arrived["reply_received"] - sent < 1.0
    second = [f for f in on_a.frames if f[1] == "reply_requested"][1][2]
    assert second["prompt"] == "Sure, Ada?" and second["step_id"] == "again"
    assert time.monotonic() - sent < 2.0
    again = pair.http_b.post(f"/workflow/reply/{trace_id}", json={"content": "late",
                                                                   "request_id": request["request_id"]})
    assert again.status_code == 409  # one answer per question, whichever process is asked

    sent = time.monotonic()
    cancelled = pair.http_b.post(f"/workflow/cancel/{trace_id}")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    on_a.join(5)
    assert on_a.frames[-1][1] == "run_cancelled" and on_a.arrived["run_cancelled"] - sent < 1.0
    kinds = [f[1] for f in stored(pair.http_b, trace_id)]
    assert kinds.count("reply_received") == 1 and kinds[-1] == "run_cancelled"


def test_a_provider_change_on_a_is_used_by_bs_next_run(pair):
    with FakeLLM() as other:
        _, worker = pair.provider_and_worker(pair.http_a)
        template = pair.template(pair.http_a, [{"id": "s", "agent": {"worker": worker}, "prompt": "hi"}])
        first = pair.run(pair.http_b, template)
        wait_for(lambda: pair.http_b.get(f"/workflow/run/{first}").json()["status"] == "succeeded", 15)
        assert len(pair.fake.chat_requests) == 1
        moved_to = pair.http_a.post("/provider", json={
            "name": "other", "provider": "openai_compatible", "model_id": "other-model",
            "api_key": "k", "base_url": other.base_url}).json()["provider_id"]
        changed = pair.http_a.put(f"/agent/worker/{worker}", json={"name": "w-fake", "provider_id": moved_to,
                                                                  "tools": []})
        assert changed.status_code == 200, changed.text
        time.sleep(0.1)  # a change is seen by every process within 100 ms
        second = pair.run(pair.http_b, template)
        wait_for(lambda: pair.http_b.get(f"/workflow/run/{second}").json()["status"] == "succeeded", 15)
        assert len(other.chat_requests) == 1 and other.chat_requests[0]["model"] == "other-model"
        assert len(pair.fake.chat_requests) == 1


def test_starting_and_restarting_b_leaves_as_runs_alone(pair):
    template = pair.template(pair.http_a, [{"id": "ask", "agent": {"human": True}, "prompt": "?"}])
    trace_id = pair.run(pair.http_a, template)
    wait_for(lambda: pair.http_a.get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_reply", 10)
    before = stored(pair.http_a, trace_id)
    pair.b.stop()
    pair.restart("b")
    time.sleep(LEASE + 1)  # B has scanned for claimable runs more than once
    assert stored(pair.http_b, trace_id) == before
    assert pair.http_b.get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_reply"
    assert pair.http_b.post(f"/workflow/reply/{trace_id}", json={"content": "ok"}).status_code == 200
    wait_for(lambda: pair.http_b.get(f"/workflow/run/{trace_id}").json()["status"] == "succeeded", 5)


def slow_three_steps(pair) -> str:
    """one (fast) -> two (slow: ~4 s of streaming) -> three (fast)."""
    _, worker = pair.provider_and_worker(pair.http_a)
    pair.fake.script_text("one done", chunks=2)
    pair.fake.script_text("two " * 40, chunks=40, delay=0.1)
    pair.fake.script_text("two again", chunks=3)
    pair.fake.script_text("three done", chunks=2)
    return pair.template(pair.http_a, [
        {"id": "one", "agent": {"worker": worker}, "prompt": "first {{input}}"},
        {"id": "two", "agent": {"worker": worker}, "prompt": "second {{steps.one.output}}",
         "depends_on": ["one"]},
        {"id": "three", "agent": {"worker": worker}, "prompt": "third {{steps.two.output}}",
         "depends_on": ["two"]},
    ])


def assert_resumed(pair, trace_id: str, reader: Reader, *, attempt: int) -> None:
    reader.join(30)
    assert reader.error is None
    frames = reader.frames
    assert [f[0] for f in frames] == list(range(1, len(frames) + 1))  # gapless, once each
    assert frames == stored(pair.http_b, trace_id)
    kinds = [f[1] for f in frames]
    assert kinds[-1] == "run_finished" and kinds.count("run_resumed") == 1
    resumed = next(f[2] for f in frames if f[1] == "run_resumed")
    assert resumed["restarted_steps"] == ["two"] and resumed["attempt"] == attempt
    prompts = [r["messages"][-1]["content"] for r in pair.fake.chat_requests]
    assert prompts.count("first go") == 1  # the finished step was not called again
    assert prompts.count("second one done") == 2 and prompts[-1] == "third two again"
    run = pair.http_b.get(f"/workflow/run/{trace_id}").json()
    assert run["status"] == "succeeded" and [s["output"] for s in run["steps"]] == [
        "one done", "two again", "three done"]


def test_kill_9_of_the_owner_mid_run_b_resumes_it(pair):
    template = slow_three_steps(pair)
    trace_id = pair.run(pair.http_a, template)
    reader = Reader(pair.http_b, trace_id)
    reader.start()
    wait_for(lambda: any(f[1] == "token" and f[2].get("step_id") == "two" for f in reader.frames), 10)
    pair.a.kill()
    killed = time.monotonic()
    wait_for(lambda: "run_resumed" in reader.arrived, LEASE + 5 + 5)
    assert reader.arrived["run_resumed"] - killed < LEASE + 5
    assert_resumed(pair, trace_id, reader, attempt=2)  # a crash is an attempt


def test_sigterm_on_the_owner_hands_the_run_to_b_at_once(tmp_path, postgres_url):
    with FakeLLM() as fake:
        # A lease far longer than the test: B can only go on because A handed the run back.
        pair = Pair(tmp_path, postgres_url, fake, env={"ORCHESTRA_RUN_LEASE_SECONDS": "60",
                                                       "ORCHESTRA_SHUTDOWN_GRACE_SECONDS": "1"})
        try:
            template = slow_three_steps(pair)
            trace_id = pair.run(pair.http_a, template)
            reader = Reader(pair.http_b, trace_id)
            reader.start()
            wait_for(lambda: any(f[1] == "token" and f[2].get("step_id") == "two" for f in reader.frames), 10)
            stopping = time.monotonic()
            pair.a.proc.terminate()
            wait_for(lambda: "run_resumed" in reader.arrived, 20)
            assert reader.arrived["run_resumed"] - stopping < 10
            assert_resumed(pair, trace_id, reader, attempt=1)  # a hand-back is not (SPEC §6)
        finally:
            pair.stop()


def test_a_dropped_listen_connection_loses_no_event(pair):
    import asyncpg

    template = pair.template(pair.http_a, [
        {"id": "ask", "agent": {"human": True}, "prompt": "first?"},
        {"id": "more", "agent": {"human": True}, "prompt": "second?", "depends_on": ["ask"]},
    ])
    trace_id = pair.run(pair.http_a, template)
    reader = Reader(pair.http_b, trace_id)
    reader.start()
    wait_for(lambda: "reply_requested" in reader.arrived, 10)

    async def drop_listeners() -> int:
        conn = await asyncpg.connect(pair.database_url)
        try:
            return len(await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'orchestra-listen' AND datname = current_database()"))
        finally:
            await conn.close()

    assert asyncio.run(drop_listeners()) == 2
    # Events stored while the listeners are down are read again once they are back.
    assert pair.http_a.post(f"/workflow/reply/{trace_id}", json={"content": "1"}).status_code == 200
    wait_for(lambda: pair.http_a.get(f"/workflow/run/{trace_id}").json()["pending_replies"], 5)
    assert pair.http_a.post(f"/workflow/reply/{trace_id}", json={"content": "2"}).status_code == 200
    reader.join(15)
    assert reader.error is None
    assert [f[0] for f in reader.frames] == list(range(1, len(reader.frames) + 1))
    assert reader.frames == stored(pair.http_a, trace_id) and reader.frames[-1][1] == "run_finished"
