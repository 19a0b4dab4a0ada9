"""A tree of 256 active child runs is cancelled whole within 2 s (SPEC §15b).

On a real `orchestra serve` (SQLite in a temp home, or `--pg URL`, a fresh database):
a top run whose `foreach` starts 51 `middle` child runs, each of which starts 4 `leaf`
runs waiting on a human step — 1 + 51 + 204 = 256 active runs, the most
`ORCHESTRA_CHILD_TREE_MAX_ACTIVE` allows by default. Once every leaf waits, `POST
/cancel/{root}`; the time printed is from that request to the moment the store shows
every run of the tree ended `cancelled` (polled every 10 ms straight from the store).

    python benchmarks/bench_child_tree.py [--middles 51] [--leaves 4] [--pg URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import orchestra_cli, orchestra_server, report  # noqa: E402

TREE = """WITH RECURSIVE tree(trace_id) AS (
  SELECT trace_id FROM workflow_run WHERE trace_id = {p}
  UNION ALL SELECT r.trace_id FROM workflow_run r JOIN tree t ON r.parent_trace_id = t.trace_id)
SELECT w.status, count(*) FROM workflow_run w JOIN tree USING (trace_id) GROUP BY w.status"""


class Statuses:
    """The tree's statuses read from the store the server uses."""

    def __init__(self, home: Path, pg: str | None) -> None:
        self.pg = pg
        self.sqlite = None if pg else sqlite3.connect(home / "orchestra.db")
        self.loop = asyncio.new_event_loop()
        self.conn = None
        if pg:
            import asyncpg

            self.conn = self.loop.run_until_complete(asyncpg.connect(pg))

    def of(self, root: str) -> dict[str, int]:
        if self.sqlite is not None:
            return dict(self.sqlite.execute(TREE.format(p="?"), (root,)).fetchall())
        rows = self.loop.run_until_complete(self.conn.fetch(TREE.format(p="$1"), root))
        return {row[0]: row[1] for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--middles", type=int, default=51)
    parser.add_argument("--leaves", type=int, default=4)
    parser.add_argument("--pg", default=None, help="a fresh PostgreSQL database URL")
    args = parser.parse_args()
    total = 1 + args.middles + args.middles * args.leaves
    env = {"ORCHESTRA_DATABASE_URL": args.pg} if args.pg else {}
    with orchestra_server(env) as (base, _proc, full_env):
        orchestra_cli(full_env, "user", "create", "bench", "--role", "USER", "--password-stdin",
                      input="password-123\n")
        token = httpx.post(f"{base}/api/v1/auth/login",
                           json={"user_name": "bench", "password": "password-123"}).json()["access_token"]
        http = httpx.Client(base_url=f"{base}/api/v1/workflow", timeout=60,
                            headers={"Authorization": f"Bearer {token}"})

        def template(name: str, steps: list) -> str:
            made = http.post("/template", json={"name": name, "steps": steps})
            made.raise_for_status()
            return made.json()["template_id"]

        template("leaf", [{"id": "q", "agent": {"human": True}, "prompt": "wait"}])
        template("middle", [{"id": "m", "foreach": {"items": str(list(range(args.leaves))), "max_concurrency": 64},
                             "workflow": {"template": "leaf", "input": "string(item)"}}])
        top = template("top", [{"id": "t", "foreach": {"items": str(list(range(args.middles))),
                                                       "max_concurrency": 64},
                                "workflow": {"template": "middle", "input": "string(item)"}}])
        root = http.post("/run", json={"template_id": top, "input": "go"}).json()["trace_id"]
        statuses = Statuses(Path(full_env["ORCHESTRA_HOME"]), args.pg)
        began = time.monotonic()
        while True:
            seen = statuses.of(root)
            if seen.get("waiting_reply", 0) >= args.middles * args.leaves:
                break
            if time.monotonic() - began > 300 or seen.get("failed"):
                raise SystemExit(f"the tree did not fill: {seen}")
            time.sleep(0.05)
        report("tree filled (runs active)", sum(seen.values()), "runs", f"= {total}")
        report("time to fill the tree", time.monotonic() - began, "s")
        sent = time.monotonic()
        answer = http.post(f"/cancel/{root}")
        assert answer.status_code == 200, answer.text
        answered = time.monotonic() - sent
        while True:
            seen = statuses.of(root)
            if seen.get("cancelled", 0) == total:
                break
            if time.monotonic() - sent > 60:
                raise SystemExit(f"not all cancelled after 60 s: {seen}")
            time.sleep(0.01)
        report("POST /cancel answered", answered, "s")
        report(f"every run of {total} cancelled", time.monotonic() - sent, "s", "< 2 s")


if __name__ == "__main__":
    main()
