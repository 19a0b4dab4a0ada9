"""What a budget costs, and a budgeted foreach wider than the pool (SPEC §12, §15b).

One real `orchestra serve` per store (SQLite, then a fresh PostgreSQL database) and the
zero-latency fake model in its own process, on a priced provider:

1. **The budget check**: runs of a 20-step chain (one model call a step), alternately
   with and without `budget_usd`; printed, the median wall time per call of each and the
   difference (what the reservation and its settlement cost a call: goal < 1 ms), and on
   PostgreSQL the store transactions committed per call of each (`pg_stat_database`):
   the budget adds at most one per call.
2. **A 64-wide budgeted foreach** (64 items at `max_concurrency` 64, a budget that holds
   two reservations at a time (each reserves ~$0.061 and costs ~$0.005), so 62 items wait
   for room at every moment, on a pool of
   ORCHESTRA_DB_POOL_SIZE 20 — 8 on SQLite): `--tries` times, whether it ended (no
   deadlock, no pool time-out), in how long, whether its cost is its steps' sum, and the
   p99 of another client's requests meanwhile.

Loopback only, bounded: each run waits at most --timeout seconds.

    python benchmarks/bench_budget.py [--runs 6] [--tries 3] [--only sqlite|postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_auth import populate  # noqa: E402
from benchmarks.bench_scale import _admin_sql, commits  # noqa: E402
from benchmarks.common import free_port, median, orchestra_server, percentile, report  # noqa: E402

FAKE = "from orchestra.testing.fake_llm import main; import sys; main(['--port', sys.argv[1], '--zero-latency'])"
SLOW = "from orchestra.testing.fake_llm import main; import sys; main(['--port', sys.argv[1], '--delay', '0.02'])"
PRICES = {"input_per_mtok": "10", "output_per_mtok": "1000"}
STEPS = 20


def wait_end(http: httpx.Client, trace_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = http.get(f"/workflow/run/{trace_id}").json()
        if run["status"] in ("succeeded", "failed", "cancelled", "interrupted", "waiting_budget"):
            return run
        time.sleep(0.02)
    return http.get(f"/workflow/run/{trace_id}").json()


def worker_on(http: httpx.Client, port: int, name: str) -> str:
    provider = http.post("/provider", json={"name": name, "provider": "openai_compatible", "model_id": "fake-model",
                                            "api_key": "k", "base_url": f"http://127.0.0.1:{port}/v1",
                                            "prices": PRICES})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": f"w-{name}", "provider_id": provider.json()["provider_id"]})
    assert worker.status_code == 201, worker.text
    return worker.json()["worker_id"]


def check_cost(http, port, pg_url, runs: int, timeout: float) -> None:
    worker = worker_on(http, port, "fast")
    steps = [{"id": f"s{i}", "agent": {"worker": worker}, "prompt": f"step {i} of {{{{input}}}}",
              "depends_on": [f"s{i - 1}"] if i else []} for i in range(STEPS)]
    made = http.post("/workflow/template", json={"name": "chain", "steps": steps})
    assert made.status_code == 201, made.text
    template = made.json()["template_id"]
    seconds: dict[bool, list[float]] = {False: [], True: []}
    xacts: dict[bool, list[float]] = {False: [], True: []}
    for n in range(runs + 1):  # the first pair warms up
        for budgeted in (False, True):
            before = commits(pg_url) if pg_url else 0
            began = time.perf_counter()
            body = {"template_id": template, "input": f"run {n}"} | ({"budget_usd": "100"} if budgeted else {})
            run = wait_end(http, http.post("/workflow/run", json=body).json()["trace_id"], timeout)
            took = time.perf_counter() - began
            assert run["status"] == "succeeded", (run["status"], run.get("error"))
            if n:
                seconds[budgeted].append(took / STEPS)
                if pg_url:
                    time.sleep(0.6)  # the backends' counters flushed
                    xacts[budgeted].append((commits(pg_url) - before) / STEPS)
    plain, budget = median(seconds[False]) * 1000, median(seconds[True]) * 1000
    report("  per call, no budget (median)", plain, "ms")
    report("  per call, under a budget (median)", budget, "ms")
    report("  the budget check (difference)", budget - plain, "ms", "< 1")
    if pg_url:
        report("  store transactions per call, no budget", median(xacts[False]), "")
        report("  store transactions per call, budget", median(xacts[True]), "")
        report("  the budget's transactions per call", median(xacts[True]) - median(xacts[False]), "", "<= 1")


def wide_map(http, port, tries: int, timeout: float) -> None:
    worker = worker_on(http, port, "slow")
    made = http.post("/workflow/template", json={
        "name": "wide", "input_schema": {"type": "array"},
        "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": 64},
                   "agent": {"worker": worker}, "prompt": "item {{index}}: {{item}}"}]})
    assert made.status_code == 201, made.text
    template = made.json()["template_id"]
    for attempt in range(1, tries + 1):
        stop = threading.Event()
        waits: list[float] = []

        def other(stop: threading.Event = stop, waits: list[float] = waits) -> None:  # another user's requests
            with httpx.Client(base_url=http.base_url, headers=http.headers, timeout=30) as mine:
                while not stop.is_set():
                    began = time.perf_counter()
                    mine.get("/workflow/template")
                    waits.append(time.perf_counter() - began)
                    time.sleep(0.02)

        reader = threading.Thread(target=other, daemon=True)
        reader.start()
        began = time.perf_counter()
        started = http.post("/workflow/run", json={"template_id": template, "budget_usd": "0.13",
                                                   "input": [f"topic {n}" for n in range(64)]})
        run = wait_end(http, started.json()["trace_id"], timeout)
        took = time.perf_counter() - began
        stop.set()
        reader.join()
        steps = sum((Decimal(s["cost_usd"]) for s in run["steps"] if s["cost_usd"] is not None), Decimal(0))
        done = len([s for s in run["steps"] if s["path"].startswith("m[") and s["status"] == "succeeded"])
        ended = run["status"] in ("failed", "succeeded")
        print(f"  try {attempt}: {run['status']} in {took:.2f} s, {done} items paid for, cost ${run['cost_usd']}"
              f" {'=' if steps == Decimal(run['cost_usd'] or 0) else '!='} steps' sum ${steps};"
              f" another client's p99 {percentile(waits, 99) * 1000:.0f} ms over {len(waits)} requests"
              f"{'' if ended else '  <-- DID NOT END'}", flush=True)


def one_store(kind: str, args) -> None:
    print(f"\n{kind}", flush=True)
    pg_url = None
    env = {"ORCHESTRA_ACCESS_TTL": "3600", "ORCHESTRA_LLM_MAX_TOKENS": "60"}
    if kind == "postgres":
        name = f"orchestra_budget_{uuid.uuid4().hex[:8]}"
        asyncio.run(_admin_sql(args.pg, f'CREATE DATABASE "{name}"'))
        pg_url = urlunparse(urlparse(args.pg)._replace(path=f"/{name}"))
        env["ORCHESTRA_DATABASE_URL"] = pg_url
    fast_port, slow_port = free_port(), free_port()
    fakes = [subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for code, port in ((FAKE, fast_port), (SLOW, slow_port))]
    try:
        with orchestra_server(env) as (base, _proc, full_env):
            token = populate(base, full_env)
            http = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                                timeout=60)
            print(f" {STEPS}-step chains, {args.runs} with a budget and {args.runs} without:", flush=True)
            check_cost(http, fast_port, pg_url, args.runs, args.timeout)
            print(" a 64-wide foreach under a budget that holds two reservations:", flush=True)
            wide_map(http, slow_port, args.tries, args.timeout)
    finally:
        for fake in fakes:
            fake.terminate()
            fake.wait(timeout=10)
        if pg_url:
            asyncio.run(_admin_sql(args.pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--only", choices=("sqlite", "postgres"))
    args = parser.parse_args()
    for kind in ("sqlite", "postgres"):
        if args.only in (None, kind):
            one_store(kind, args)


if __name__ == "__main__":
    main()
