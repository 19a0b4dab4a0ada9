"""Hostile-user benchmark (issue "Trust", SPEC §15): another user's latency while one
user repeats each attack on what users supply.

Against one real `orchestra serve` on loopback (SQLite), a plain USER repeats one attack
at a time for `--seconds`, from `--hostile` concurrent connections, while a super
administrator calls `GET /api/v1/auth/list` one request after another. For each attack
the script prints the victim's p50 and p99 (goal p99 < 100 ms) and what the attacker
was answered. The attacks:

- `schema_pattern`: `POST /run` whose input meets `"pattern": "^(a+)+$"` with `a`x40 + `!`
  (catastrophic backtracking for a backtracking regex engine);
- `schema_check`: `POST /template/check` with a human step `default` against the same pattern;
- `cel_map`: runs whose human question renders `{{ input.map(x, input).size() }}` over
  2,000 items (quadratic work in the CEL library);
- `big_prompt`: runs whose question renders `{{input}}` x100 with a 100 KB input;
- `reply_pattern`: replies to a waiting human step whose `output_schema` has the pattern.

Then it stops the server with `--poisoned` runs waiting on a heavy question, starts it
again on the same store and prints how long the first request took to answer (goal < 5 s).
Every loop is bounded in time and count and talks to loopback only. Run from the project
root: `python benchmarks/bench_hostile.py`. `--part shared` runs, instead, what one user
can take of what users share (waiting runs, a wide budgeted map, a child tree, `/mcp`
sessions, a webhook flood: benchmarks/hostile_shared.py), `--pg URL` on PostgreSQL too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import hostile_shared  # noqa: E402
from benchmarks.common import (  # noqa: E402
    median,
    orchestra_cli,
    orchestra_server,
    percentile,
    report,
)

ADMIN = ("bench_admin", "bench-admin-password")
HOSTILE = ("bench_hostile", "bench-hostile-password")
EVIL = "^(a+)+$"
EVIL_TEXT = "a" * 40 + "!"
MAX_REQUESTS = 100_000  # a hard bound on any one phase


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "ORCHESTRA_HOME": str(home), "ORCHESTRA_SECRET_KEY": "bench-secret-" + "z" * 32}


async def _login(client: httpx.AsyncClient, who: tuple[str, str]) -> dict[str, str]:
    answer = await client.post("/api/v1/auth/login", json={"user_name": who[0], "password": who[1]})
    answer.raise_for_status()
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


async def _template(client: httpx.AsyncClient, auth: dict, body: dict) -> str:
    answer = await client.post("/api/v1/workflow/template", json=body, headers=auth)
    if answer.status_code != 201:
        raise RuntimeError(f"template {body['name']}: {answer.status_code} {answer.text[:300]}")
    return answer.json()["template_id"]


def _human(name: str, prompt: str, *, input_schema: dict | None = None, output_schema: dict | None = None) -> dict:
    step: dict = {"id": "ask", "agent": {"human": True}, "prompt": prompt}
    if output_schema is not None:
        step["output_schema"] = output_schema
    body: dict = {"name": name, "steps": [step]}
    if input_schema is not None:
        body["input_schema"] = input_schema
    return body


async def _victim(client: httpx.AsyncClient, auth: dict, until: float) -> list[float]:
    """Sequential `GET /auth/list` latencies (ms) until the deadline."""
    latencies: list[float] = []
    while time.monotonic() < until and len(latencies) < MAX_REQUESTS:
        started = time.perf_counter()
        try:
            answer = await client.get("/api/v1/auth/list", headers=auth, timeout=60)
            ok = answer.status_code == 200
        except httpx.TransportError:
            ok = False
        latencies.append((time.perf_counter() - started) * 1000 if ok else float("inf"))
        await asyncio.sleep(0.01)
    return latencies


async def _attacker(make, until: float, counts: dict[int, int]) -> None:
    sent = 0
    while time.monotonic() < until and sent < MAX_REQUESTS:
        sent += 1
        try:
            status = (await make()).status_code
        except httpx.TransportError:
            status = 0
        counts[status] = counts.get(status, 0) + 1


async def _phase(name: str, base: str, admin: dict, make, *, seconds: float, hostile: int) -> None:
    until = time.monotonic() + seconds
    counts: dict[int, int] = {}
    async with httpx.AsyncClient(base_url=base, timeout=120) as victim_client, \
            httpx.AsyncClient(base_url=base, timeout=120) as attack_client:
        bound = (lambda: make(attack_client)) if make else None
        tasks = [_attacker(bound, until, counts) for _ in range(hostile)] if bound else []
        latencies, *_ = await asyncio.gather(_victim(victim_client, admin, until), *tasks)
    report(f"{name}: victim p50", median(latencies), "ms")
    report(f"{name}: victim p99", percentile(latencies, 99), "ms", "< 100")
    if counts:
        print(f"  {name}: attacker answers {dict(sorted(counts.items()))}", flush=True)


async def _attacks(base: str, seconds: float, hostile: int, poisoned: int) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        admin = await _login(client, ADMIN)
        evil = await _login(client, HOSTILE)
        pattern = await _template(client, evil, _human(
            "pattern", "Say something", input_schema={"type": "string", "pattern": EVIL}))
        cel_map = await _template(client, evil, _human(
            "cel map", "{{ input.map(x, input).size() }}", input_schema={"type": "array"}))
        big = await _template(client, evil, _human("big prompt", "{{input}}" * 100))
        replied = await _template(client, evil, _human(
            "reply pattern", "Answer", output_schema={"type": "string", "pattern": EVIL}))
        waiting = (await client.post("/api/v1/workflow/run", headers=evil,
                                     json={"template_id": replied, "input": "x"})).json()["trace_id"]
        for _ in range(poisoned):
            await client.post("/api/v1/workflow/run", headers=evil,
                              json={"template_id": cel_map, "input": list(range(2_000))})
    check_body = {"name": "check", "steps": [{
        "id": "ask", "agent": {"human": True}, "prompt": "?", "timeout_seconds": 60,
        "default": EVIL_TEXT, "output_schema": {"type": "string", "pattern": EVIL}}]}
    phases = {
        "baseline": None,
        "schema_pattern": lambda c: c.post("/api/v1/workflow/run", headers=evil,
                                           json={"template_id": pattern, "input": EVIL_TEXT}),
        "schema_check": lambda c: c.post("/api/v1/workflow/template/check", headers=evil, json=check_body),
        "cel_map": lambda c: c.post("/api/v1/workflow/run", headers=evil,
                                    json={"template_id": cel_map, "input": list(range(2_000))}),
        "big_prompt": lambda c: c.post("/api/v1/workflow/run", headers=evil,
                                       json={"template_id": big, "input": "b" * 100_000}),
        "reply_pattern": lambda c: c.post(f"/api/v1/workflow/reply/{waiting}", headers=evil,
                                          json={"content": EVIL_TEXT}),
    }
    for name, make in phases.items():
        await _phase(name, base, admin, make, seconds=seconds, hostile=hostile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--hostile", type=int, default=4, help="concurrent attacking connections")
    parser.add_argument("--poisoned", type=int, default=5, help="heavy runs left waiting across the restart")
    parser.add_argument("--part", choices=("language", "shared", "all"), default="all",
                        help="language: the attacks above; shared: what users share "
                             "(benchmarks/hostile_shared.py); all: both")
    parser.add_argument("--pg", default=None, help="a PostgreSQL server URL: the shared part runs on a "
                                                    "fresh database there too")
    parser.add_argument("--phases", default=",".join(hostile_shared.PHASES),
                        help="the shared part's phases, comma-separated")
    args = parser.parse_args()
    if args.part in ("shared", "all"):
        for pg in (None, args.pg) if args.pg else (None,):
            hostile_shared.run(pg, args.phases.split(","))
    if args.part == "shared":
        return
    with tempfile.TemporaryDirectory(prefix="orchestra-hostile-") as tmp:
        home = Path(tmp)
        env = _env(home)
        orchestra_cli(env, "user", "create", ADMIN[0], "--role", "SUPER_ADMINISTRATOR", "--password-stdin",
                      input=ADMIN[1] + "\n")
        orchestra_cli(env, "user", "create", HOSTILE[0], "--password-stdin", input=HOSTILE[1] + "\n")
        with orchestra_server(home=home) as (base, _proc, _env_used):
            asyncio.run(_attacks(base, args.seconds, args.hostile, args.poisoned))
        started = time.monotonic()  # the same store again, its poisoned runs waiting
        with orchestra_server(home=home) as _served:
            report("restart with poisoned runs: first answer", time.monotonic() - started, "s", "< 5")


if __name__ == "__main__":
    main()
