"""A schedule saved on one `orchestra serve` process reaches the other processes' fire
loops at once (SPEC §11; a `cache` hint over PostgreSQL LISTEN/NOTIFY), not at their
next idle look (up to 30 s later).

Two real servers on one PostgreSQL database. B starts first-thing before the save, so
its idle fire loop's next look is about 30 s after its start — well after the due time.
The schedule is saved on A, and A is killed (SIGKILL) before the due time: only B can
fire it, and it does so on time only if the save woke it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import asyncpg
import httpx

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import fake_worker, login
from tests.fakes.fake_llm import FakeLLM

IDLE_SECONDS = 30  # schedule_fires.IDLE_SECONDS: an idle loop's longest sleep


def fires(url: str, schedule_id: str) -> list:
    async def go() -> list:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetch(
                "SELECT f.due_at, f.fired_at, f.outcome, e.created_at AS started_at FROM schedule_fire f "
                "LEFT JOIN run_event e ON e.run_id = f.trace_id AND e.kind = 'run_started' "
                "WHERE f.schedule_id = $1 ORDER BY f.due_at", schedule_id)
        finally:
            await conn.close()

    return asyncio.run(go())


def test_a_schedule_saved_on_a_is_fired_on_time_by_an_idle_b(tmp_path, postgres_url):
    with FakeLLM() as fake:
        a = ServerProcess(tmp_path / "a", database_url=postgres_url).start()
        b = ServerProcess(tmp_path / "b", database_url=postgres_url)
        try:
            headers = login(a, "admin", "ADMINISTRATOR")
            with httpx.Client(base_url=a.base_url + "/api/v1", headers=headers, timeout=20) as http:
                worker = fake_worker(http, fake)
                made = http.post("/workflow/template", json={"name": "tick", "steps": [
                    {"id": "a", "agent": {"worker": worker}, "prompt": "tick"}]})
                assert made.status_code == 201, made.text
                template = made.json()["template_id"]
                # B starts at second 36 or later: its loop's first look is then, its next
                # one at least 30 s after — past the next minute's due time + 6 s.
                if time.time() % 60 > 40:
                    time.sleep(60 - time.time() % 60)
                time.sleep(max(0.0, 36 - time.time() % 60))
                b_started = time.time()
                b.start(timeout=15)
                time.sleep(2)  # its loop's first look is done: it sleeps its idle 30 s now
                saved = http.post("/workflow/schedule", json={
                    "template_id": template, "cron": "* * * * *", "input": "x", "overlap": "allow"})
                assert saved.status_code == 201, saved.text
                schedule_id = saved.json()["schedule"]["schedule_id"]
            due = dt.datetime.fromisoformat(saved.json()["schedule"]["next_fires"][0])
            assert due.timestamp() - time.time() > 1, "saved too close to the due time to kill A first"
            a.proc.kill()  # only B can fire it now
            a.proc.wait()
            assert b_started + IDLE_SECONDS > due.timestamp() + 5  # an idle B would be late
            time.sleep(max(0.0, due.timestamp() - time.time() + 4))
            rows = fires(postgres_url, schedule_id)
            assert len(rows) == 1, rows
            row = rows[0]
            assert row["due_at"] == due.astimezone(dt.UTC).replace(tzinfo=None) and row["outcome"] == "started"
            assert (row["fired_at"] - row["due_at"]).total_seconds() < 2, row
            assert row["started_at"] is not None and (row["started_at"] - row["due_at"]).total_seconds() < 3, row
        finally:
            a.stop()
            b.stop()
