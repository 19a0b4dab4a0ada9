"""A foreach of 1,000 items on one server process and PostgreSQL (SPEC §8, issue 15).

A real `orchestra serve` on a fresh database and the zero-latency fake model (its own
process, no sleeps): one run of one `foreach` step (`max_concurrency` 64) over N items,
read live by one SSE reader. Printed: wall time, items/s, store transactions and rows
per item, the server's RSS before, at its peak during the run and after, and how far
the reader was behind when the run's terminal event was stored.

    python benchmarks/bench_foreach.py [--items 1000] [--max-concurrency 64] [--pg URL]

Goals: it completes; RSS grows < 100 MiB; the reader keeps up (it gets the terminal
event within a second of it being stored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_auth import populate  # noqa: E402
from benchmarks.bench_scale import _admin_sql, commits  # noqa: E402
from benchmarks.common import free_port, orchestra_server, report, rss_bytes  # noqa: E402

FAKE = "from orchestra.testing.fake_llm import main; import sys; main(['--port', sys.argv[1], '--zero-latency'])"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--max-concurrency", type=int, default=64)
    args = parser.parse_args()
    name = f"orchestra_foreach_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin_sql(args.pg, f'CREATE DATABASE "{name}"'))
    pg_url = urlunparse(urlparse(args.pg)._replace(path=f"/{name}"))
    fake_port = free_port()
    fake = subprocess.Popen([sys.executable, "-c", FAKE, str(fake_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"ORCHESTRA_DATABASE_URL": pg_url, "ORCHESTRA_ACCESS_TTL": "3600"}
    try:
        with orchestra_server(env) as (base, proc, full_env):
            token = populate(base, full_env)
            http = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                                timeout=120)
            provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                                    "model_id": "fake-model", "api_key": "k",
                                                    "base_url": f"http://127.0.0.1:{fake_port}/v1"})
            worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider.json()["provider_id"]})
            made = http.post("/workflow/template", json={
                "name": "map", "input_schema": {"type": "array"},
                "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": args.max_concurrency},
                           "agent": {"worker": worker.json()["worker_id"]}, "prompt": "item {{index}}: {{item}}"}]})
            assert made.status_code == 201, made.text
            template = made.json()["template_id"]
            warm = http.post("/workflow/run", json={"template_id": template, "input": ["warm"] * 8}).json()
            with http.stream("GET", f"/workflow/sse/{warm['trace_id']}") as response:
                for _ in response.iter_lines():
                    pass
            rss_before = rss_bytes(proc.pid)
            peak = [rss_before]
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], rss_bytes(proc.pid))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            before = commits(pg_url)
            began = time.perf_counter()
            trace = http.post("/workflow/run", json={
                "template_id": template, "input": [f"topic {n}" for n in range(args.items)]}).json()["trace_id"]
            events, terminal, read_at, lag = 0, None, None, float("nan")
            with http.stream("GET", f"/workflow/sse/{trace}") as response:
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        events += 1
                        kind = line[6:].strip()
                        if kind in ("run_finished", "run_failed", "run_cancelled"):
                            terminal, read_at = kind, time.perf_counter()
                    elif line.startswith("data:") and terminal and lag != lag:
                        stored = datetime.fromisoformat(json.loads(line[5:])["ts"].replace("Z", "+00:00"))
                        lag = time.time() - stored.timestamp()  # stored → read by this reader
            wall = read_at - began
            done.set()
            sampler.join()
            after = commits(pg_url)
            detail = http.get(f"/workflow/run/{trace}").json()
            items_ok = sum(1 for s in detail["steps"] if s["path"].startswith("m[") and s["status"] == "succeeded")
            report("foreach items", args.items, "")
            report("run status (1 = succeeded)", float(detail["status"] == "succeeded"), "", "1")
            report("items succeeded", items_ok, "", str(args.items))
            report("wall time, run start to terminal event read", wall, "s")
            report("items/s", args.items / wall, "/s")
            report("events read by the stream reader", events, "")
            report("reader lag behind the terminal event", lag, "s", "< 1")
            report("store transactions per item", (after - before) / args.items, "")
            report("server RSS before, MiB", rss_before / 2**20, "MiB")
            report("server RSS peak during the run, MiB", peak[0] / 2**20, "MiB")
            report("server RSS growth, MiB", (peak[0] - rss_before) / 2**20, "MiB", "< 100")
            report("server RSS after, MiB", rss_bytes(proc.pid) / 2**20, "MiB")
    finally:
        fake.terminate()
        fake.wait(timeout=10)
        asyncio.run(_admin_sql(args.pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
