"""Paging a long run history through a real server: every page of `GET /workflow/run`.

20,000 runs of one user (and as many of another, so the owner filter matters) are
written straight to the store, then a client walks every page by `next_cursor` and
times each request end to end on loopback. The same walk for `?all=true` (an
administrator, 40,000 runs) and for a run's 20,000 stored events by `next_after`.
Goal: every page under 50 ms, the last as fast as the first (keyset paging + indexes).
On SQLite always; on PostgreSQL too when ORCHESTRA_BENCH_POSTGRES_URL names a server
(a database is created and dropped).

    python benchmarks/bench_paging.py [--runs 20000] [--limit 100]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import median, orchestra_server, percentile, report  # noqa: E402
from orchestra.core import Core  # noqa: E402
from orchestra.db.models import RunEvent, WorkflowRun  # noqa: E402
from orchestra.services import auth  # noqa: E402
from orchestra.services.roles import Role  # noqa: E402
from orchestra.settings import Settings  # noqa: E402

PASSWORD = "bench-password-1"
SECRET = "bench-secret-" + "z" * 32


async def fill(home: Path, database_url: str, runs: int) -> str:
    """Two users with `runs` runs each; the first run of `root` gets `runs` events."""
    settings = Settings.from_env(env={}, home=home, database_url=database_url, secret_key=SECRET,
                                 argon2_time_cost=1, argon2_memory_cost=1024, argon2_parallelism=1)
    core = await Core.open(settings)
    try:
        root = await auth.register(core, user_name="root", password=PASSWORD, role=Role.SUPER_ADMINISTRATOR)
        other = await auth.register(core, user_name="other", password=PASSWORD, role=Role.USER)
        start = dt.datetime(2026, 1, 1)
        first = None
        for owner in (root.id, other.id):
            rows = [dict(trace_id=str(uuid.uuid4()), owner=owner, template_name="t", steps=[],
                         status="succeeded", created_at=start + dt.timedelta(seconds=i // 2),
                         finished_at=start + dt.timedelta(seconds=i // 2 + 1)) for i in range(runs)]
            first = first or rows[0]["trace_id"]
            for at in range(0, runs, 1000):
                await WorkflowRun.insert_many(rows[at:at + 1000]).aexecute()
        for at in range(1, runs + 1, 1000):
            await RunEvent.insert_many([dict(run=first, seq=seq, kind="token", data={"text": "x" * 40})
                                        for seq in range(at, min(at + 1000, runs + 1))]).aexecute()
        return first
    finally:
        await core.close()


def walk(client: httpx.Client, path: str, key: str, params: dict, follow: str, follow_param: str) -> tuple[list[float], int]:
    """Seconds per page and rows seen, following `follow` into `follow_param`."""
    times, seen, params = [], 0, dict(params)
    while True:
        started = time.perf_counter()
        response = client.get(path, params=params)
        times.append(time.perf_counter() - started)
        response.raise_for_status()
        body = response.json()
        seen += len(body[key])
        if body[follow] is None:
            return times, seen
        params[follow_param] = body[follow]


def measure(label: str, database_url: str | None, runs: int, limit: int) -> None:
    with tempfile.TemporaryDirectory(prefix="orchestra-bench-paging-") as tmp:
        home = Path(tmp)
        url = database_url or f"sqlite:///{home / 'orchestra.db'}"
        first = asyncio.run(fill(home, url, runs))
        with orchestra_server({"ORCHESTRA_DATABASE_URL": url, "ORCHESTRA_SECRET_KEY": SECRET}, home=home) as (base, _, _):
            token = httpx.post(f"{base}/api/v1/auth/login", json={"user_name": "root", "password": PASSWORD}).json()["access_token"]
            with httpx.Client(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
                client.get("/workflow/run", params={"limit": 1})  # warm up
                for name, path, key, params, follow, param in (
                    ("own runs", "/workflow/run", "runs", {"limit": limit}, "next_cursor", "cursor"),
                    ("all runs", "/workflow/run", "runs", {"limit": limit, "all": "true"}, "next_cursor", "cursor"),
                    ("events", f"/workflow/run/{first}/events", "events", {"limit": 1000}, "next_after", "after"),
                ):
                    times, seen = walk(client, path, key, params, follow, param)
                    ms = [t * 1000 for t in times]
                    print(f"{label}: {name}: {seen} rows in {len(times)} pages")
                    report(f"{label} {name}: page median", median(ms), "ms")
                    report(f"{label} {name}: page p95", percentile(ms, 95), "ms")
                    report(f"{label} {name}: slowest page", max(ms), "ms", "< 50")
                    report(f"{label} {name}: last page", ms[-1], "ms", "< 50")


async def _pg(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--limit", type=int, default=100)
    args = parser.parse_args()
    measure("sqlite", None, args.runs, args.limit)
    base = os.environ.get("ORCHESTRA_BENCH_POSTGRES_URL")
    if base:
        name = f"orchestra_bench_{uuid.uuid4().hex[:10]}"
        asyncio.run(_pg(base, f'CREATE DATABASE "{name}"'))
        try:
            measure("postgres", urlunparse(urlparse(base)._replace(path=f"/{name}")), args.runs, args.limit)
        finally:
            asyncio.run(_pg(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    else:
        print("postgres: skipped (set ORCHESTRA_BENCH_POSTGRES_URL)")


if __name__ == "__main__":
    main()
