"""Provider limits across two processes (SPEC §12): 100 runs on two `orchestra serve`
processes sharing PostgreSQL, against a fake model that answers 429 above a
tokens-per-minute figure; the provider is registered with that figure as its
`limits.tokens_per_minute`.

Prints: how much of the limit the runs used while they were saturating it (tokens the
fake admitted per minute, over the limit), how many 429s the fake sent and how many
steps failed (a 429 must never surface to a step), and fairness — each run's wait for
its model call against its fair share. All runs are started at once; each makes one
call of the same size, so with a fair queue the k-th run served waits about k/N of the
whole; a run's fair share is the mean wait of all runs, and the figure printed is the
largest wait over twice that mean ("≤ 1": no run waited more than 2× its fair share).

Then what the limiter costs the store: a 20-step run on a provider with a limit that
never makes a call wait, and the same on a provider without limits, one after the other
(`--cost-rounds` each); the store transactions committed per model call (PostgreSQL's
`pg_stat_database`, read after a settle so every backend has flushed its counters), and
the difference: the limiter's extra transactions per call.

Loopback only, bounded (it stops after --timeout seconds), every process stopped.
Run from the project root: `python benchmarks/bench_provider_limits.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_auth import populate  # noqa: E402
from benchmarks.bench_scale import _admin_sql, commits  # noqa: E402
from benchmarks.common import median, orchestra_server, report  # noqa: E402
from orchestra.testing.fake_llm import FakeLLM  # noqa: E402

PROMPT = " ".join(f"word{n}" for n in range(30))  # 30 prompt tokens, a 31-token echo


def timestamp(value: str | None) -> float | None:
    from datetime import datetime

    return None if not value else datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def drive(bases: list[str], token: str, fake: FakeLLM, runs: int, tpm: int,
                timeout: float) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        api = bases[0] + "/api/v1"
        provider = (await http.post(f"{api}/provider", json={
            "name": "limited", "provider": "openai_compatible", "model_id": "fake-model",
            "api_key": "k", "base_url": fake.base_url, "limits": {"tokens_per_minute": tpm}})).json()
        worker = (await http.post(f"{api}/agent/worker", json={
            "name": "w", "provider_id": provider["provider_id"], "tools": []})).json()
        assert "provider_id" in provider, provider
        assert "worker_id" in worker, worker
        template = (await http.post(f"{api}/workflow/template", json={
            "name": "one", "steps": [{"id": "a", "agent": {"worker": worker["worker_id"]},
                                      "prompt": PROMPT + " {{input}}"}]})).json()
        started_at = time.time()

        async def start(n: int) -> tuple[str, str]:
            base = bases[n % len(bases)] + "/api/v1"
            answer = await http.post(f"{base}/workflow/run", json={
                "template_id": template["template_id"], "input": f"run{n}"})
            if answer.status_code != 202:
                raise RuntimeError(f"POST /workflow/run: {answer.status_code} {answer.text[:300]}")
            return base, answer.json()["trace_id"]

        started = await asyncio.gather(*(start(n) for n in range(runs)))
        deadline = time.monotonic() + timeout
        details: dict[str, dict] = {}
        while time.monotonic() < deadline and len(details) < runs:
            for base, trace_id in started:
                if trace_id in details:
                    continue
                run = (await http.get(f"{base}/workflow/run/{trace_id}")).json()
                if run["status"] in ("succeeded", "failed", "cancelled", "interrupted"):
                    details[trace_id] = run
            await asyncio.sleep(0.5)
        ended_at = time.time()
    failed = [r for r in details.values() if r["status"] != "succeeded"]
    waits = []
    for run in details.values():
        step = run["steps"][0]
        finished = timestamp(step.get("finished_at")) or ended_at
        waits.append(finished - started_at)
    admitted = fake.meter.admitted_tokens
    elapsed = ended_at - started_at
    # a 60 s sliding window lets `tpm` through at once, then `tpm` a minute: the fastest
    # possible time for `admitted` tokens is (admitted / tpm − 1) minutes
    ideal = max(0.0, (admitted / tpm - 1) * 60)
    last = max(waits) if waits else elapsed
    report("runs ended / started", len(details), f"of {runs}")
    report("tokens the fake admitted", admitted, "tokens")
    report("the limit's use while saturated (ideal / actual time)", ideal / last if last else 0.0,
           "x", ">= 0.9")
    report("429s the fake answered", fake.meter.refused, "")
    report("steps that failed (a 429 surfacing counts)", len(failed), "", "0")
    mean = sum(waits) / len(waits) if waits else float("nan")
    report("wait for the call: median, s", median(waits), "s")
    report("wait for the call: max, s", max(waits) if waits else float("nan"), "s")
    report("largest wait / (2 x fair share)", (max(waits) / (2 * mean)) if waits else float("nan"),
           "x", "<= 1")


STEPS = 20  # model calls per run of the transactions phase
SETTLE = 11.0  # seconds: PostgreSQL backends flush their counters at least every 10 s when idle


def store_cost(base: str, token: str, fake: FakeLLM, pg_url: str, rounds: int) -> None:
    """Store transactions per model call, with a limit that never makes a call wait and
    without limits; the difference is the limiter's."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base + "/api/v1", headers=headers, timeout=60) as http:
        templates = {}
        for name, limits in (("free", None), ("paced", {"requests_per_minute": 1_000_000})):
            provider = http.post("/provider", json={
                "name": name, "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
                "base_url": fake.base_url, **({"limits": limits} if limits else {})}).json()
            worker = http.post("/agent/worker", json={
                "name": f"w_{name}", "provider_id": provider["provider_id"], "tools": []}).json()
            steps = [{"id": f"s{i}", "agent": {"worker": worker["worker_id"]}, "prompt": f"Say {i}",
                      "depends_on": [f"s{i - 1}"] if i else []} for i in range(STEPS)]
            templates[name] = http.post("/workflow/template", json={"name": f"chain_{name}",
                                                                    "steps": steps}).json()["template_id"]
        per_call: dict[str, list[float]] = {"free": [], "paced": []}
        time.sleep(SETTLE)
        for _ in range(rounds):
            for name, template_id in templates.items():
                before = commits(pg_url)
                trace_id = http.post("/workflow/run", json={"template_id": template_id,
                                                            "input": "x"}).json()["trace_id"]
                deadline = time.monotonic() + 120
                while http.get(f"/workflow/run/{trace_id}").json()["status"] not in ("succeeded", "failed"):
                    if time.monotonic() > deadline:
                        raise RuntimeError("a run of the transactions phase did not end")
                    time.sleep(0.1)
                time.sleep(SETTLE)
                per_call[name].append((commits(pg_url) - before) / STEPS)
    free, paced = median(per_call["free"]), median(per_call["paced"])
    report("store transactions per call, no limits", free, "")
    report("store transactions per call, a limit", paced, "")
    report("the limiter's transactions per call", paced - free, "", "< 2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("ORCHESTRA_TEST_POSTGRES_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--tokens-per-minute", type=int, default=2500)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--cost-rounds", type=int, default=3,
                        help="runs per provider in the transactions phase (0: skip it)")
    args = parser.parse_args()
    name = f"orchestra_bench_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin_sql(args.pg, f'CREATE DATABASE "{name}"'))
    pg_url = urlunparse(urlparse(args.pg)._replace(path=f"/{name}"))
    env = {"ORCHESTRA_DATABASE_URL": pg_url, "ORCHESTRA_LLM_MAX_TOKENS": "64"}
    try:
        with orchestra_server(env) as (base_a, _, env_a), orchestra_server(env) as (base_b, _, _):
            token = populate(base_a, env_a)
            with FakeLLM(tokens_per_minute=args.tokens_per_minute) as fake:
                asyncio.run(drive([base_a, base_b], token, fake, args.runs, args.tokens_per_minute,
                                  args.timeout))
            if args.cost_rounds:
                with FakeLLM() as fake:  # no limit of its own: no call waits
                    store_cost(base_a, token, fake, pg_url, args.cost_rounds)
    finally:
        asyncio.run(_admin_sql(args.pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
