"""Code steps (SPEC §17, issue 35): what a code step costs and what a hostile one cannot take.

Printed:
- the sandbox's cost per code step, warm, p50/p99 (`CodeSandbox.run` of a small
  expression over a step's variables), beside the same computation as an inline CEL
  expression (`Scope.evaluate`, what a plain `output` mapping costs);
- a 1,000-item `foreach` of code steps on one `orchestra serve` and PostgreSQL: items/s;
- another client's p99 (GET /auth/list) while ten `while True` code steps run;
- the code workers' RSS at rest (each `monty subprocess` child of the server).

    python benchmarks/bench_code.py [--items 1000] [--pg URL]

Goals: ≤ 1 ms p50 warm per code step; ≥ 1,000 items/s; victim p99 < 100 ms; workers
≤ 64 MiB at rest.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_auth import populate  # noqa: E402
from benchmarks.bench_scale import _admin_sql  # noqa: E402
from benchmarks.common import orchestra_server, percentile, report, rss_bytes  # noqa: E402


async def sandbox_cost(calls: int = 500) -> None:
    from orchestra.engine.code_sandbox import CodeBounds, CodeSandbox
    from orchestra.language.expressions import Scope

    variables = {"input": {"rows": [{"amount": i} for i in range(20)]},
                 "steps": {"a": {"output": "x", "status": "succeeded"}}}
    sandbox = CodeSandbox(CodeBounds())
    now = dt.datetime.now(dt.UTC)
    try:
        await sandbox.run("1", variables, now)  # the pool starts
        took = []
        for _ in range(calls):
            began = time.perf_counter()
            await sandbox.run("sum([r['amount'] for r in input['rows']])", variables, now)
            took.append(time.perf_counter() - began)
    finally:
        await sandbox.close()
    cel = []
    for _ in range(calls):
        began = time.perf_counter()
        await Scope(variables).evaluate("input.rows.size() + 1")
        cel.append(time.perf_counter() - began)
    report("code step in the sandbox, p50", percentile(took, 50) * 1000, "ms", "<= 1")
    report("code step in the sandbox, p99", percentile(took, 99) * 1000, "ms")
    report("inline CEL output mapping, p50", percentile(cel, 50) * 1000, "ms")


def wait(http: httpx.Client, trace_id: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = http.get(f"/workflow/run/{trace_id}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            return body
        time.sleep(0.05)
    raise RuntimeError(f"run {trace_id} did not end in {timeout} s")


def workers_rss(pid: int) -> list[int]:
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    found = []
    for child in children:
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"monty" in command:
            found.append(rss_bytes(int(child)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--items", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(sandbox_cost())
    name = f"orchestra_code_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin_sql(args.pg, f'CREATE DATABASE "{name}"'))
    pg_url = urlunparse(urlparse(args.pg)._replace(path=f"/{name}"))
    env = {"ORCHESTRA_DATABASE_URL": pg_url, "ORCHESTRA_ACCESS_TTL": "3600",
           "ORCHESTRA_FOREACH_MAX_ITEMS": str(max(1000, args.items))}
    try:
        with orchestra_server(env) as (base, proc, full_env):
            token = populate(base, full_env)
            http = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                                timeout=120)
            made = http.post("/workflow/template", json={
                "name": "map", "input_schema": {"type": "array"},
                "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": 64},
                           "code": {"source": "','.join([str(index), str(item * 2)])"}}]})
            assert made.status_code == 201, made.text
            template = made.json()["template_id"]
            wait(http, http.post("/workflow/run", json={"template_id": template, "input": [1] * 8}).json()["trace_id"])
            rest = workers_rss(proc.pid)
            began = time.perf_counter()
            run = http.post("/workflow/run", json={"template_id": template, "input": list(range(args.items))}).json()
            detail = wait(http, run["trace_id"])
            took = time.perf_counter() - began
            assert detail["status"] == "succeeded", detail.get("error")
            report(f"foreach of {args.items} code steps (PostgreSQL)", args.items / took, "items/s", ">= 1000")

            spin = http.post("/workflow/template", json={"name": "spin", "steps": [
                {"id": f"s{i}", "on_error": "continue", "code": {"source": "while True:\n    pass"}}
                for i in range(10)]}).json()["template_id"]
            latencies: list[float] = []
            done = threading.Event()

            def victim() -> None:
                with httpx.Client(base_url=base + "/api/v1", timeout=10) as other:
                    while not done.is_set():
                        started = time.perf_counter()
                        other.get("/auth/list", headers={"Authorization": f"Bearer {token}"})
                        latencies.append(time.perf_counter() - started)
                        time.sleep(0.005)

            thread = threading.Thread(target=victim)
            thread.start()
            wait(http, http.post("/workflow/run", json={"template_id": spin, "input": "x"}).json()["trace_id"])
            done.set()
            thread.join()
            report("victim p99 while ten `while True` code steps ran", percentile(latencies, 99) * 1000,
                   "ms", "< 100")
            report("code workers at rest (largest RSS)", max(rest, default=0) / 2**20, "MiB", "<= 64")
            report("code workers at rest (count)", len(rest), "workers")
    finally:
        asyncio.run(_admin_sql(args.pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
