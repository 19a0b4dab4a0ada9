"""Hostile sharing benchmark (issue "Trust, second pass", SPEC §15b): another user's
latency while one user takes what users share.

One real `orchestra serve` (SQLite in a temp home, or `--pg URL`: a fresh database on
that server, dropped afterwards) and the fake model (20 ms a chunk, priced) in a process
of its own. Two plain users: while the attacker does one thing for a phase, the victim
calls `GET /api/v1/workflow/template` one request after another (10 ms apart, from a
process of its own) and, at the phase's end, starts a one-step run of its own and times
it to `succeeded`. Printed for each phase: the victim's p50 and p99 (goal p99 < 100 ms),
its run's time, and what the attacker was answered. The phases:

- `baseline`: nobody attacks;
- `waiting`: 500 runs of a one-question template, started 20 at a time and left waiting
  (a waiting run holds no run slot);
- `wide_budget`: a 64-wide foreach at `max_concurrency` 64 under a budget that holds two
  reservations at a time (the rest wait for room, holding no connection);
- `tree`: a 15 x 16 child tree (a foreach of 15 child runs, each a foreach of 16 waiting
  leaves: 256 runs with the root, exactly the tree's default cap of active runs; a 16th
  child would fail the tree), then cancelled whole; the cancel's time is printed too
  (goal < 2 s, SPEC §15b);
- `mcp_sessions`: 1,000 `/mcp` sessions opened (the handshake era's `initialize`), 8 at
  a time (one user keeps at most its cap; the oldest close);
- `hook_flood`: unsigned calls to the attacker's webhook from 8 connections (refused;
  they do not use up the hook's limit for signed calls).

Loopback only; every phase is bounded in time and count.

    python benchmarks/bench_hostile.py --part shared [--pg postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx
from standardwebhooks import Webhook

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_scale import _admin_sql  # noqa: E402
from benchmarks.common import free_port, median, orchestra_cli, orchestra_server, percentile, report  # noqa: E402

FAKE = "from orchestra.testing.fake_llm import main; import sys; main(['--port', sys.argv[1], '--delay', '0.02'])"
PRICES = {"input_per_mtok": "10", "output_per_mtok": "1000"}
ADMIN = ("bench_admin", "bench-admin-password")
VICTIM = ("bench_victim", "bench-victim-password")
ATTACKER = ("bench_attacker", "bench-attacker-password")
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
RUN_ENDED = ("succeeded", "failed", "cancelled", "interrupted", "waiting_budget")


def _victim_loop(base_url: str, headers: dict, stop, out) -> None:
    """The victim's requests, in a process of its own: one after another, 10 ms apart,
    until `stop` is set; then (latencies in ms, failures) on `out`."""
    latencies: list[float] = []
    failures = 0
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as http:
        while not stop.is_set() and len(latencies) < 100_000:
            began = time.perf_counter()
            try:
                ok = http.get("/workflow/template").status_code == 200
            except httpx.TransportError:
                ok = False
            if ok:
                latencies.append((time.perf_counter() - began) * 1000)
            else:
                failures += 1
            time.sleep(0.01)
    out.send((latencies, failures))


class Victim:
    """Another user's sequential requests, timed, from a process of its own: neither the
    attacker's event loop nor its share of this process's GIL (parsing a thousand
    answers) delays them, so what is measured is the server."""

    def __init__(self, http: httpx.Client) -> None:
        self.latencies: list[float] = []
        self.failures = 0
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._out, into = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_victim_loop, args=(str(http.base_url), dict(http.headers), self._stop, into), daemon=True)

    def __enter__(self) -> Victim:
        self._process.start()
        time.sleep(1.0)  # the interpreter's start is not the server's latency
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.latencies, self.failures = self._out.recv()
        self._process.join(timeout=30)


def wait_status(http: httpx.Client, trace_id: str, statuses: tuple[str, ...], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = http.get(f"/workflow/run/{trace_id}").json()
        if run["status"] in statuses or time.monotonic() > deadline:
            return run
        time.sleep(0.02)


def own_run(http: httpx.Client, template: str) -> float:
    """The victim's one-step run, from `POST /run` to `succeeded` (s; inf if it did not)."""
    began = time.perf_counter()
    trace_id = http.post("/workflow/run", json={"template_id": template, "input": "mine"}).json()["trace_id"]
    run = wait_status(http, trace_id, RUN_ENDED, 60)
    return time.perf_counter() - began if run["status"] == "succeeded" else float("inf")


@contextmanager
def phase(name: str, victim_http: httpx.Client, victim_template: str):
    answers: dict[int, int] = {}
    with Victim(victim_http) as victim:
        yield answers
    run_took = own_run(victim_http, victim_template)
    report(f"{name}: victim p50", median(victim.latencies), "ms")
    report(f"{name}: victim p99", percentile(victim.latencies, 99), "ms", "< 100")
    report(f"{name}: victim's own run", run_took, "s")
    if victim.failures:
        print(f"  {name}: {victim.failures} victim request(s) failed", flush=True)
    if answers:
        print(f"  {name}: attacker answers {dict(sorted(answers.items()))}", flush=True)


async def many(count: int, width: int, send, answers: dict[int, int]) -> list[httpx.Response]:
    """`send(n)` for n in range(count), at most `width` at a time; statuses counted."""
    gate = asyncio.Semaphore(width)
    out: list[httpx.Response] = []

    async def one(n: int) -> None:
        async with gate:
            try:
                response = await send(n)
                out.append(response)
                answers[response.status_code] = answers.get(response.status_code, 0) + 1
            except httpx.TransportError:
                answers[0] = answers.get(0, 0) + 1

    await asyncio.gather(*(one(n) for n in range(count)))
    return out


def login(base: str, who: tuple[str, str]) -> dict[str, str]:
    answer = httpx.post(f"{base}/api/v1/auth/login", json={"user_name": who[0], "password": who[1]})
    answer.raise_for_status()
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


def template(http: httpx.Client, name: str, steps: list, **more) -> str:
    made = http.post("/workflow/template", json={"name": name, "steps": steps, **more})
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


class Attacks:
    """The users, the templates and the phases, on one server."""

    def __init__(self, base: str, fake_port: int, env: dict) -> None:
        orchestra_cli(env, "user", "create", ADMIN[0], "--role", "SUPER_ADMINISTRATOR", "--password-stdin",
                      input=ADMIN[1] + "\n")
        for who in (VICTIM, ATTACKER):
            httpx.post(f"{base}/api/v1/auth/register",
                       json={"user_name": who[0], "password": who[1]}).raise_for_status()
        self.base, self.api = base, base + "/api/v1"
        admin = httpx.Client(base_url=self.api, headers=login(base, ADMIN), timeout=60)
        provider = admin.post("/provider", json={
            "name": "fake", "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
            "base_url": f"http://127.0.0.1:{fake_port}/v1", "prices": PRICES})
        assert provider.status_code == 201, provider.text
        self.victim = httpx.Client(base_url=self.api, headers=login(base, VICTIM), timeout=60)
        self.evil_headers = login(base, ATTACKER)
        self.evil = httpx.Client(base_url=self.api, headers=self.evil_headers, timeout=60)
        workers = {}
        for name, http in (("victim", self.victim), ("attacker", self.evil)):
            made = http.post("/agent/worker", json={"name": f"w-{name}",
                                                    "provider_id": provider.json()["provider_id"]})
            assert made.status_code == 201, made.text
            workers[name] = made.json()["worker_id"]
        self.mine = template(self.victim, "mine", [{"id": "a", "agent": {"worker": workers["victim"]},
                                                     "prompt": "{{input}}"}])
        self.ask = template(self.evil, "ask", [{"id": "q", "agent": {"human": True}, "prompt": "wait"}])
        self.wide = template(self.evil, "wide", [{
            "id": "m", "foreach": {"items": "input", "max_concurrency": 64},
            "agent": {"worker": workers["attacker"]}, "prompt": "item {{index}}: {{item}}"}],
            input_schema={"type": "array"})
        template(self.evil, "leaf", [{"id": "q", "agent": {"human": True}, "prompt": "wait"}])
        sixteen = {"items": str(list(range(16))), "max_concurrency": 64}
        fifteen = {"items": str(list(range(15))), "max_concurrency": 64}  # 1 + 15 + 15 x 16 = 256 runs
        template(self.evil, "middle", [{"id": "m", "foreach": sixteen,
                                        "workflow": {"template": "leaf", "input": "string(item)"}}])
        self.top = template(self.evil, "top", [{"id": "t", "foreach": fifteen,
                                                "workflow": {"template": "middle", "input": "string(item)"}}])
        hook = self.evil.post("/workflow/hook", json={"template_id": self.ask})
        assert hook.status_code == 201, hook.text
        self.hook_url, self.hook_secret = hook.json()["url"], hook.json()["secret"]

    def run(self, phases: list[str]) -> None:
        for name in phases:
            with phase(name, self.victim, self.mine) as answers:
                getattr(self, name)(answers)

    def baseline(self, answers: dict[int, int]) -> None:
        time.sleep(5)

    def waiting(self, answers: dict[int, int]) -> None:
        async def start() -> None:
            async with httpx.AsyncClient(base_url=self.api, headers=self.evil_headers, timeout=60) as client:
                await many(500, 20, lambda n: client.post(
                    "/workflow/run", json={"template_id": self.ask, "input": f"wait {n}"}), answers)
        asyncio.run(start())
        time.sleep(3)  # and while they wait

    def wide_budget(self, answers: dict[int, int]) -> None:
        started = self.evil.post("/workflow/run", json={"template_id": self.wide, "budget_usd": "0.13",
                                                        "input": [f"topic {n}" for n in range(64)]})
        answers[started.status_code] = 1
        run = wait_status(self.evil, started.json()["trace_id"], RUN_ENDED, 120)
        print(f"  wide_budget: the map ended {run['status']} (its budget pays for a few items), "
              f"cost ${run['cost_usd']}", flush=True)

    def tree(self, answers: dict[int, int]) -> None:
        root = self.evil.post("/workflow/run", json={"template_id": self.top, "input": "go"}).json()["trace_id"]
        deadline, seen, steady = time.monotonic() + 60, -1, 0
        while time.monotonic() < deadline and steady < 3:  # until the tree stops growing
            time.sleep(0.5)
            runs = self.evil.get("/workflow/run", params={"limit": 1000}).json()["runs"]
            now = sum(r["status"] == "waiting_reply" for r in runs)
            steady, seen = (steady + 1, now) if now == seen else (0, now)
        print(f"  tree: {seen} of the attacker's newest 1,000 runs waiting", flush=True)
        sent = time.monotonic()
        answers[self.evil.post(f"/workflow/cancel/{root}").status_code] = 1
        ended = wait_status(self.evil, root, ("cancelled", "failed", "succeeded"), 60)
        report("tree: cancel to the root's end", time.monotonic() - sent, "s", "< 2")
        print(f"  tree: root {ended['status']} {ended.get('error') or ''}", flush=True)

    def mcp_sessions(self, answers: dict[int, int]) -> None:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "bench", "version": "1"}}}

        async def open_sessions() -> None:
            async with httpx.AsyncClient(base_url=self.base, headers=self.evil_headers | MCP_HEADERS,
                                         timeout=60) as client:
                await many(1000, 8, lambda n: client.post("/mcp", json=body), answers)
        asyncio.run(open_sessions())

    def hook_flood(self, answers: dict[int, int]) -> None:
        async def flood() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                await many(3000, 8, lambda n: client.post(self.hook_url, json={"n": n}), answers)
        asyncio.run(flood())
        body, msg_id = '{"signed": true}', f"msg_{uuid.uuid4().hex}"
        when = dt.datetime.now(dt.UTC)
        signed = httpx.post(self.hook_url, content=body, headers={
            "webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": Webhook(self.hook_secret).sign(msg_id, when, body),
            "content-type": "application/json"})
        print(f"  hook_flood: a signed call after the flood: {signed.status_code} (goal 202)", flush=True)


PHASES = ["baseline", "waiting", "wide_budget", "tree", "mcp_sessions", "hook_flood"]


def run(pg: str | None, phases: list[str] = PHASES) -> None:
    env, name = {"ORCHESTRA_ACCESS_TTL": "3600", "ORCHESTRA_LLM_MAX_TOKENS": "60"}, None
    if pg:
        name = f"orchestra_hostile_{uuid.uuid4().hex[:8]}"
        asyncio.run(_admin_sql(pg, f'CREATE DATABASE "{name}"'))
        env["ORCHESTRA_DATABASE_URL"] = urlunparse(urlparse(pg)._replace(path=f"/{name}"))
    print(f"\nshared resources, {'PostgreSQL' if pg else 'SQLite'}", flush=True)
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-c", FAKE, str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        with orchestra_server(env) as (base, _proc, full_env):
            Attacks(base, port, full_env).run(phases)
    finally:
        fake.terminate()
        fake.wait(timeout=10)
        if name:
            asyncio.run(_admin_sql(pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
