"""What a store outage costs (SPEC §6), and a load figure.

    python benchmarks/bench_outage.py [--outage 10] [--runs 10]
    python benchmarks/bench_outage.py --load 200 [--max-runs 100]

Outage: a PostgreSQL cluster of its own (initdb/pg_ctl as the postgres user, like
tests/e2e/test_faults.py; never the shared server), one `orchestra serve`, `--runs`
two-step runs streaming from the fake model; the store is stopped for `--outage`
seconds mid-run while a client keeps asking for a run. Prints runs failed, 5xx
answers, time to recover (store back → every run ended, and → first 200) and the lines
the server logged during the outage.

Load: `--load N` runs started at once on one process (200 tokens, 20 ms apart each
step), while another client times an unrelated request (`GET /auth/list`): prints runs
failed, 5xx answers to `POST /run`, and that request's p50/p99.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestra.testing.fake_llm import FakeLLM  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402
from tests.e2e.pgcluster import PgCluster, missing_reason  # noqa: E402
from tests.e2e.test_workflow_e2e import login  # noqa: E402

ENDED = ("succeeded", "failed", "cancelled", "interrupted")


def setup(server: ServerProcess, fake: FakeLLM, steps: list[dict]) -> tuple[httpx.Client, str]:
    headers = login(server, "admin", "ADMINISTRATOR")
    http = httpx.Client(base_url=server.base_url + "/api/v1", headers=headers, timeout=60)
    provider = http.post("/provider", json={
        "name": "fake", "provider": "openai_compatible", "model_id": "fake-model",
        "api_key": "k", "base_url": fake.base_url}).json()["provider_id"]
    worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider,
                                              "tools": []}).json()["worker_id"]
    for step in steps:
        step["agent"] = {"worker": worker}
    template = http.post("/workflow/template", json={"name": "t", "steps": steps})
    return http, template.json()["template_id"]


def wait_ended(http: httpx.Client, ids: list[str], timeout: float) -> dict[str, str]:
    status: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for trace_id in ids:
            if status.get(trace_id) in ENDED:
                continue
            answer = http.get(f"/workflow/run/{trace_id}")
            if answer.status_code == 200:
                status[trace_id] = answer.json()["status"]
        if len(status) == len(ids) and all(s in ENDED for s in status.values()):
            break
        time.sleep(0.2)
    return status


def outage(seconds: float, runs: int) -> None:
    cluster = PgCluster().start()
    home = Path(cluster.root.parent / f"orchestra-bench-{time.monotonic_ns()}")
    env = {"ORCHESTRA_RUN_LEASE_SECONDS": "5", "ORCHESTRA_SHUTDOWN_GRACE_SECONDS": "2"}
    try:
        with FakeLLM(chunk_delay=0.1) as fake:
            server = ServerProcess(home, database_url=cluster.url, env=env).start()
            try:
                http, template = setup(server, fake, [
                    {"id": "one", "prompt": "one {{input}} " + "w " * 30},
                    {"id": "two", "prompt": "two {{input}} " + "w " * 30, "depends_on": ["one"]},
                ])
                ids = [http.post("/workflow/run", json={"template_id": template,
                                                        "input": f"r{i}"}).json()["trace_id"]
                       for i in range(runs)]
                time.sleep(1.5)
                log_before = len(server.log_path.read_text(errors="replace").splitlines())
                cluster.stop_server()
                codes: list[int] = []
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    codes.append(http.get(f"/workflow/run/{ids[0]}").status_code)
                    time.sleep(0.25)
                cluster.start_server()
                back = time.monotonic()
                first_ok = None
                while first_ok is None and time.monotonic() - back < 60:
                    code = http.get(f"/workflow/run/{ids[0]}").status_code
                    codes.append(code)
                    if code == 200:
                        first_ok = time.monotonic() - back
                    else:
                        time.sleep(0.1)
                status = wait_ended(http, ids, 180)
                all_ended = time.monotonic() - back
                lines = server.log_path.read_text(errors="replace").splitlines()[log_before:]
                logged = [line for line in lines if line.strip() and "HTTP/1.1" not in line]
            finally:
                server.stop()
    finally:
        cluster.remove()
    failed = sum(1 for s in status.values() if s != "succeeded") + (runs - len(status))
    print(f"store outage of {seconds:.0f} s, {runs} runs in flight (lease 5 s):")
    print(f"  runs failed               {failed} of {runs}")
    print(f"  5xx answers               {sum(c >= 500 for c in codes)} "
          f"(503: {codes.count(503)}, 500: {codes.count(500)}) of {len(codes)} requests")
    print(f"  store back -> first 200   {first_ok if first_ok is None else round(first_ok, 2)} s")
    print(f"  store back -> all ended   {all_ended:.1f} s")
    print(f"  log lines meanwhile       {len(logged)} "
          f"(tracebacks: {sum('Traceback' in line for line in logged)})")
    for line in logged[:25]:
        print("    " + line[:160])


def load(count: int, max_runs: int) -> None:
    if missing_reason() is not None:
        print(f"skipped: {missing_reason()}")
        return
    cluster = PgCluster().start()
    home = Path(cluster.root.parent / f"orchestra-bench-{time.monotonic_ns()}")
    env = {"ORCHESTRA_MAX_RUNS": str(max_runs)}
    try:
        with FakeLLM(chunk_delay=0.02) as fake:
            server = ServerProcess(home, database_url=cluster.url, env=env).start()
            try:
                http, template = setup(server, fake, [
                    {"id": "one", "prompt": "{{input}} " + "w " * 199},
                ])
                timings: list[float] = []
                stop = threading.Event()

                def probe() -> None:
                    client = httpx.Client(base_url=http.base_url, headers=http.headers, timeout=30)
                    while not stop.is_set():
                        began = time.perf_counter()
                        client.get("/auth/list")
                        timings.append(time.perf_counter() - began)
                        time.sleep(0.05)

                prober = threading.Thread(target=probe, daemon=True)
                prober.start()
                codes: list[int] = []
                errors: list[str] = []
                ids: list[str] = []
                lock = threading.Lock()

                def start(i: int) -> None:
                    client = httpx.Client(base_url=http.base_url, headers=http.headers, timeout=60)
                    answer = client.post("/workflow/run", json={"template_id": template,
                                                                "input": f"r{i}"})
                    with lock:
                        codes.append(answer.status_code)
                        if answer.status_code >= 400:
                            errors.append(f"{answer.status_code} {answer.json().get('error')}")
                        if answer.status_code == 202:
                            ids.append(answer.json()["trace_id"])

                began = time.monotonic()
                starters = [threading.Thread(target=start, args=(i,)) for i in range(count)]
                for t in starters:
                    t.start()
                for t in starters:
                    t.join()
                status = wait_ended(http, ids, 600)
                took = time.monotonic() - began
                stop.set()
                prober.join(5)
                log = server.log_path.read_text(errors="replace")
            finally:
                server.stop()
    finally:
        cluster.remove()
    failed = sum(1 for s in status.values() if s != "succeeded") + (len(ids) - len(status))
    ordered = sorted(timings)
    p99 = ordered[int(len(ordered) * 0.99) - 1] if ordered else float("nan")
    print(f"{count} runs at once on one process (ORCHESTRA_MAX_RUNS {max_runs}), "
          "200 tokens 20 ms apart each:")
    print(f"  POST /run answers         {sorted(set(codes))}; 5xx: {sum(c >= 500 for c in codes)}"
          + (f" ({', '.join(f'{n}x {e}' for e, n in Counter(errors).items())})" if errors else ""))
    print(f"  runs failed               {failed} of {len(ids)}  (all ended in {took:.1f} s)")
    print(f"  claims lost               {log.count('held by another process')}")
    print(f"  GET /auth/list meanwhile  p50 {statistics.median(ordered) * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms ({len(ordered)} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--load", type=int, default=0)
    parser.add_argument("--max-runs", type=int, default=100)
    args = parser.parse_args()
    if missing_reason() is not None:
        print(f"skipped: {missing_reason()}")
        return
    if args.load:
        load(args.load, args.max_runs)
    else:
        outage(args.outage, args.runs)


if __name__ == "__main__":
    main()
