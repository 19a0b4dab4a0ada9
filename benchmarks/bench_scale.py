"""Several server processes on one PostgreSQL database (issue 6's figures).

Real `orchestra serve` processes A and B on a fresh database (same secret, as two hosts
behind a load balancer) and a zero-latency FakeLLM process, all on loopback:

1. SSE delivery latency p50/p99 of subscribers on the run's owner (A) and on the other
   process (B), in one run       goal: B's p99 <= A's p99 + 30 ms
2. store transactions per second (pg_stat_database) with 0 and with `--idle` idle
   subscribers on B              goal: no growth with subscribers
3. requests/s of `GET /auth/list` on A over a bare Sanic JSON route, same run
                                 goal: >= 0.5, as on SQLite
4. runs per second on the zero-latency fake, submitted to A alone, then spread over A
   and B: the ratio is reported

    python benchmarks/bench_scale.py [--pg postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_auth import bare_sanic, populate, run_load  # noqa: E402
from benchmarks.bench_sse import FAKE, Subscriber  # noqa: E402
from benchmarks.common import free_port, median, orchestra_server, percentile, report  # noqa: E402


async def _admin_sql(url: str, sql: str):
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(sql)
    finally:
        await conn.close()


def commits(url: str) -> int:
    rows = asyncio.run(_admin_sql(url, "SELECT xact_commit FROM pg_stat_database "
                                       "WHERE datname = current_database()"))
    return int(rows[0]["xact_commit"])


class World:
    def __init__(self, base_a: str, base_b: str, token: str, fake_url: str) -> None:
        self.a = httpx.Client(base_url=base_a + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                              timeout=60)
        self.b = httpx.Client(base_url=base_b + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                              timeout=60)
        self.token = token
        provider = self.a.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                                  "model_id": "m", "api_key": "k", "base_url": fake_url})
        self.worker = self.a.post("/agent/worker", json={
            "name": "w", "provider_id": provider.json()["provider_id"]}).json()["worker_id"]

    def template(self, steps: list[dict]) -> str:
        return self.a.post("/workflow/template", json={"name": uuid.uuid4().hex, "steps": steps}
                           ).json()["template_id"]


async def attach(base: str, trace_id: str, token: str, count: int) -> list[Subscriber]:
    host, port = base.split("//")[1].split(":")
    request = (f"GET /api/v1/workflow/sse/{trace_id} HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").encode()
    loop = asyncio.get_running_loop()
    subs = [Subscriber(request) for _ in range(count)]
    await asyncio.gather(*(loop.create_connection(lambda s=s: s, host, int(port)) for s in subs))
    await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in subs)), 60)
    return subs


async def latency(world: World, base_a: str, base_b: str, per_process: int) -> None:
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "go?"},
             {"id": "s", "agent": {"worker": world.worker}, "prompt": "{{steps.h.output}}",
              "depends_on": ["h"]}]
    template = world.template(steps)
    trace_id = world.a.post("/workflow/run", json={"template_id": template}).json()["trace_id"]
    await asyncio.sleep(0.5)
    on_a = await attach(base_a, trace_id, world.token, per_process)
    on_b = await attach(base_b, trace_id, world.token, per_process)
    await asyncio.sleep(0.5)
    world.a.post(f"/workflow/reply/{trace_id}", json={"content": "go"})
    await asyncio.wait_for(asyncio.gather(*(s.done for s in on_a + on_b)), 120)
    stored = len(world.a.get(f"/workflow/run/{trace_id}/events").json()["events"])
    for name, subs in (("owner (A)", on_a), ("other process (B)", on_b)):
        live = [lat for s in subs for lat, seq in zip(s.latencies, s.seqs) if seq > 3]
        every = all(s.seqs == list(range(1, stored + 1)) for s in subs)
        report(f"SSE latency p50, {len(subs)} readers on {name}", median(live) * 1000, "ms")
        report(f"SSE latency p99, {len(subs)} readers on {name}", percentile(live, 99) * 1000, "ms")
        report(f"  every event once, in order, on {name}", float(every), "bool")
        for sub in subs:
            sub.close()


async def idle_load(world: World, base_b: str, pg_url: str, idle: int, seconds: float) -> None:
    template = world.template([{"id": "h", "agent": {"human": True}, "prompt": "wait"}])
    trace_id = world.a.post("/workflow/run", json={"template_id": template}).json()["trace_id"]
    await asyncio.sleep(1)

    async def rate() -> float:
        before = await asyncio.to_thread(commits, pg_url)
        await asyncio.sleep(seconds)
        return (await asyncio.to_thread(commits, pg_url) - before) / seconds

    none = await rate()
    subs = await attach(base_b, trace_id, world.token, idle)
    await asyncio.sleep(1)
    some = await rate()
    report("store transactions/s, 0 idle subscribers on B", none, "/s")
    report(f"store transactions/s, {idle} idle subscribers on B", some, "/s", "no growth")
    world.a.post(f"/workflow/cancel/{trace_id}")
    await asyncio.wait_for(asyncio.gather(*(s.done for s in subs), return_exceptions=True), 30)
    for sub in subs:
        sub.close()


def throughput(world: World, clients: list[httpx.Client], runs: int) -> float:
    template = world.template([{"id": "s", "agent": {"worker": world.worker}, "prompt": "hi"}])
    began = time.perf_counter()
    ids = [clients[i % len(clients)].post("/workflow/run", json={"template_id": template}).json()["trace_id"]
           for i in range(runs)]
    pending = set(ids)
    while pending:
        listed = world.a.get("/workflow/run", params={"limit": 1000}).json()["runs"]
        pending -= {r["trace_id"] for r in listed if r["status"] == "succeeded"}
        time.sleep(0.05)
    return runs / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--readers", type=int, default=100, help="SSE readers per process")
    parser.add_argument("--idle", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    name = f"orchestra_bench_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin_sql(args.pg, f'CREATE DATABASE "{name}"'))
    pg_url = urlunparse(urlparse(args.pg)._replace(path=f"/{name}"))
    fake_port = free_port()
    fake = subprocess.Popen([sys.executable, "-c", FAKE, str(fake_port), "60", "0.06"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"ORCHESTRA_DATABASE_URL": pg_url}
    try:
        with orchestra_server(env) as (base_a, proc_a, env_a), orchestra_server(env) as (base_b, _, _):
            token = populate(base_a, env_a)
            world = World(base_a, base_b, token, f"http://127.0.0.1:{fake_port}/v1")
            asyncio.run(latency(world, base_a, base_b, args.readers))
            asyncio.run(idle_load(world, base_b, pg_url, args.idle, args.seconds))
            ratios = []
            with bare_sanic() as (bare, _):
                for _ in range(3):
                    ours = run_load("python", f"{base_a}/api/v1/auth/list", token=token,
                                    connections=16, seconds=args.seconds)
                    theirs = run_load("python", f"{bare}/api/v1/auth/list", token=token,
                                      connections=16, seconds=args.seconds)
                    ratios.append(ours.rate(200) / theirs.rate())
                    report("GET /auth/list on PostgreSQL, requests/s", ours.rate(200), "/s")
                    report("bare Sanic, requests/s", theirs.rate(), "/s")
            report("GET /auth/list PostgreSQL / bare Sanic (median of 3)", median(ratios), "x", ">= 0.5")
            one = throughput(world, [world.a], args.runs)
            two = throughput(world, [world.a, world.b], args.runs)
            report("runs/s, zero-latency fake, 1 process (A)", one, "/s")
            report("runs/s, zero-latency fake, 2 processes (A+B)", two, "/s")
            report("runs/s ratio, 2 processes / 1", two / one, "x")
    finally:
        fake.terminate()
        fake.wait(timeout=10)
        asyncio.run(_admin_sql(args.pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
