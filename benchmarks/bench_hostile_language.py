"""A hostile user repeats the workflow language's worst cases; another user's latency.

Against a real `orchestra serve` (SQLite), one client per attack sends it in a loop:
a run whose input hits a backtracking `pattern` (`^(a+)+$` against "a" * 40 + "!"), a
run whose prompt maps 16,000 items (`input.map(x, x).size()`: ~15 s of CEL), a run whose
input (100,000 items) must be checked against 2,000 subschemas each, and a reply with
300,000 violations. Meanwhile a super administrator lists the users (`GET /auth/list`)
every 20 ms. Goal (SPEC §15): that client's p99 < 100 ms. Prints the attacks' counts,
how long they took, and the victim's p50/p99/max.

    python benchmarks/bench_hostile_language.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import orchestra_cli, orchestra_server, percentile, report

PASSWORD = "password-123"
HUMAN = {"agent": {"human": True}}


def login(base: str, env: dict, name: str, role: str) -> dict:
    orchestra_cli(env, "user", "create", name, "--role", role, "--password-stdin", input=PASSWORD + "\n")
    token = httpx.post(f"{base}/api/v1/auth/login", json={"user_name": name, "password": PASSWORD}).json()
    return {"Authorization": f"Bearer {token['access_token']}"}


def template(http: httpx.Client, name: str, steps: list, **extra) -> str:
    made = http.post("/workflow/template", json={"name": name, "steps": steps, **extra})
    assert made.status_code == 201, made.text
    return made.json()["template_id"]


def attacks(http: httpx.Client) -> dict[str, tuple[str, dict]]:
    """name -> (path, JSON body) of one attack, its templates made."""
    redos = template(http, "redos", [{"id": "h", **HUMAN, "prompt": "{{input}}"}],
                     input_schema={"type": "string", "pattern": "^(a+)+$"})
    heavy = template(http, "heavy", [{"id": "h", **HUMAN, "prompt": "{{ input.map(x, x).size() }}"}],
                     input_schema={"type": "array"})
    wide_schema = {"type": "array", "items": {"allOf": [{"type": "integer", "minimum": 0}] * 2000}}
    wide = template(http, "wide", [{"id": "h", **HUMAN, "prompt": "go"}], input_schema=wide_schema)
    many_schema = {"type": "array", "items": {"allOf": [{"type": "string"}] * 300}}
    asks = template(http, "asks", [{"id": "h", **HUMAN, "prompt": "list?", "output_schema": many_schema}])
    waiting = http.post("/workflow/run", json={"template_id": asks, "input": "x"}).json()["trace_id"]
    return {
        "pattern ^(a+)+$ (422)": ("/workflow/run", {"template_id": redos, "input": "a" * 40 + "!"}),
        "map over 16,000 items (a failed step)": ("/workflow/run", {
            "template_id": heavy, "input": list(range(16_000))}),
        "100,000 items x 2,000 subschemas (422)": ("/workflow/run", {
            "template_id": wide, "input": [1] * 100_000}),
        "reply with 300,000 violations (422)": (f"/workflow/reply/{waiting}", {"content": [1] * 1000}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--only", default="", help="run only the attacks whose name has this text")
    args = parser.parse_args()
    with orchestra_server() as (base, _proc, env):
        hostile = login(base, env, "hostile", "USER")
        victim = login(base, env, "victim", "SUPER_ADMINISTRATOR")
        with httpx.Client(base_url=base + "/api/v1", headers=hostile, timeout=60) as setup:
            sends = {k: v for k, v in attacks(setup).items() if args.only in k}
        time.sleep(1)  # the reply attack's question is asked
        stop = time.monotonic() + args.seconds
        took: dict[str, list[float]] = {name: [] for name in sends}

        def loop(name: str) -> None:
            path, body = sends[name]
            with httpx.Client(base_url=base + "/api/v1", headers=hostile, timeout=60) as http:
                while time.monotonic() < stop:
                    began = time.perf_counter()
                    http.post(path, json=body)
                    took[name].append(time.perf_counter() - began)

        threads = [threading.Thread(target=loop, args=(name,)) for name in sends]
        for thread in threads:
            thread.start()
        latencies = []
        with httpx.Client(base_url=base + "/api/v1", headers=victim, timeout=60) as http:
            while time.monotonic() < stop:
                began = time.perf_counter()
                assert http.get("/auth/list").status_code == 200
                latencies.append(time.perf_counter() - began)
                time.sleep(0.02)
        for thread in threads:
            thread.join()
        for name, times in took.items():
            report(f"hostile: {name}, {len(times)} sent, median", percentile(times, 50) * 1000, "ms")
        report(f"victim GET /auth/list, {len(latencies)} requests, p50", percentile(latencies, 50) * 1000, "ms")
        report("victim GET /auth/list p99", percentile(latencies, 99) * 1000, "ms", "< 100 ms")
        report("victim GET /auth/list max", max(latencies) * 1000, "ms")


if __name__ == "__main__":
    main()
