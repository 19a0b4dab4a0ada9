"""Server memory over many large runs, and under readers that never read.

A real `orchestra serve` and a FakeLLM (in this process, on loopback). Each run has
`--steps` agent steps whose prompts carry a ~0.9 MB input and whose answers are ~0.9 MB
each, so a run stores ~`--steps` × 2.7 MB of events (~10 MB by default). Server RSS is
read before (baseline, after one warm-up run), at its peak during `--runs` runs, and
after the runs once idle; then during one more such run with `--stuck` subscribers that
connect with a small receive buffer and never read.
Goals: after ≤ baseline + 64 MiB; with the stuck readers ≤ baseline + 64 MiB.

    python benchmarks/bench_soak.py [--runs 20] [--steps 4] [--stuck 20] [--db URL]
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import orchestra_cli, orchestra_server, report, rss_bytes  # noqa: E402
from orchestra.testing.fake_llm import FakeLLM  # noqa: E402

MIB = 1024 * 1024
BIG = 900_000


class Peak(threading.Thread):
    """Samples a process's RSS every 50 ms; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.05)


def wait_done(http: httpx.Client, trace_id: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = http.get(f"/workflow/run/{trace_id}").json()["status"]
        if status not in ("queued", "running"):
            return status
        time.sleep(0.1)
    raise RuntimeError(f"run {trace_id} did not end in {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--stuck", type=int, default=20)
    parser.add_argument("--db", default=None, help="database URL (default: SQLite in a temp home)")
    args = parser.parse_args()
    env = {"ORCHESTRA_DATABASE_URL": args.db} if args.db else {}
    with FakeLLM() as fake, orchestra_server(env) as (base, proc, full_env):
        orchestra_cli(full_env, "user", "create", "soak", "--role", "ADMINISTRATOR",
                      "--password-stdin", input="soak-password\n")
        token = httpx.post(f"{base}/api/v1/auth/login",
                           json={"user_name": "soak", "password": "soak-password"}).json()["access_token"]
        http = httpx.Client(base_url=base + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                            timeout=60)
        provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                                "model_id": "m", "api_key": "k",
                                                "base_url": fake.base_url}).json()["provider_id"]
        worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider,
                                                  "tools": []}).json()["worker_id"]
        steps = [{"id": f"s{i}", "agent": {"worker": worker}, "prompt": "{{input}}",
                  "depends_on": [f"s{i - 1}"] if i else []} for i in range(args.steps)]
        template = http.post("/workflow/template", json={"name": "big", "steps": steps}).json()["template_id"]

        def one_run() -> str:
            for _ in range(args.steps):
                fake.script_text("b" * BIG, chunks=8)
            trace_id = http.post("/workflow/run", json={"template_id": template,
                                                        "input": "a" * BIG}).json()["trace_id"]
            assert wait_done(http, trace_id) == "succeeded"
            return trace_id

        one_run()  # warm-up: imports, pools, caches
        time.sleep(1)
        baseline = rss_bytes(proc.pid)
        peak = Peak(proc.pid)
        peak.start()
        began = time.monotonic()
        for _ in range(args.runs):
            one_run()
        elapsed = time.monotonic() - began
        time.sleep(2)
        after = rss_bytes(proc.pid)
        peak.running = False

        # One more big run, with readers that connect and never read.
        for _ in range(args.steps):
            fake.script_text("b" * BIG, chunks=8, delay=0.2)
        trace_id = http.post("/workflow/run", json={"template_id": template,
                                                    "input": "a" * BIG}).json()["trace_id"]
        port = int(base.rsplit(":", 1)[1])
        stuck = []
        for _ in range(args.stuck):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(f"GET /api/v1/workflow/sse/{trace_id} HTTP/1.1\r\nHost: x\r\n"
                         f"Authorization: Bearer {token}\r\n\r\n".encode())
            stuck.append(sock)
        with_stuck = Peak(proc.pid)
        with_stuck.start()
        status = wait_done(http, trace_id)
        time.sleep(1)
        with_stuck.running = False
        for sock in stuck:
            sock.close()
        stored = sum(len(str(e["data"])) for e in
                     http.get(f"/workflow/run/{trace_id}/events").json()["events"])

    print(f"runs: {args.runs} of {args.steps} steps, ~{stored / MIB:.1f} MiB of events each, "
          f"{elapsed:.1f} s; stuck-reader run: {status}")
    report("server RSS baseline (after a warm-up run)", baseline / MIB, "MiB")
    report("server RSS peak during the runs", peak.peak / MIB, "MiB")
    report("server RSS after the runs, idle", after / MIB, "MiB",
           f"<= baseline + 64 = {baseline / MIB + 64:.0f}")
    report("growth after the runs", (after - baseline) / MIB, "MiB", "<= 64")
    report(f"server RSS peak with {args.stuck} non-reading subscribers", with_stuck.peak / MIB, "MiB",
           f"<= baseline + 64 = {baseline / MIB + 64:.0f}")
    report("growth with the non-reading subscribers", (with_stuck.peak - baseline) / MIB, "MiB", "<= 64")


if __name__ == "__main__":
    main()
