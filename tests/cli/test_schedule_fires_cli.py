"""What started a run, from the terminal, through a real server: a schedule's fire history
(`schedule fires`, paged), its last fire as a readable line in `schedule show`, and the
runs it started named as the schedule's in `workflow list` and `workflow show` (issue 39,
point 6)."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import time

import pytest

from tests.cli.cli_harness import api_world

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


def fired_schedule(world) -> tuple[str, list[dict]]:
    """A per-minute schedule whose next due time is put 3 minutes into the past (in the
    server's own SQLite store), then woken by a save: catchup `none` records the 3 late due
    times `missed` and starts a run for the one on time. (schedule_id, its fires)
    Under load a due time may pass meanwhile: the counts are read from the API."""
    cli, api = world["cli"], world["api"]
    template = world["templates"]["three_step"]["template_id"]
    done = cli("schedule", "add", template, "* * * * *", "--tz", "Asia/Kolkata", "--input", "tides",
               "--catchup", "none", "--overlap", "allow")
    assert done.returncode == 0, done.stderr
    schedule_id = done.stdout.strip()
    due = (dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=3, seconds=5)).replace(
        second=0, microsecond=0)
    with sqlite3.connect(world["server"].home / "orchestra.db", timeout=30) as db:
        db.execute("UPDATE workflow_schedule SET next_due_at = ? WHERE id = ?",
                   (due.isoformat(sep=" "), schedule_id))
    assert cli("schedule", "update", schedule_id, "--input", "tides").returncode == 0  # wakes the fire loop
    for _ in range(300):
        fires = api.get(f"/workflow/schedule/{schedule_id}/fires").json()["fires"]
        if len(fires) >= 4 and all(f["run_status"] in (None, "succeeded", "failed") for f in fires):
            # no more fires from here on (a minute passes during a slow test)
            assert cli("schedule", "disable", schedule_id).returncode == 0
            return schedule_id, api.get(f"/workflow/schedule/{schedule_id}/fires").json()["fires"]
        time.sleep(0.1)
    raise AssertionError(f"fires: {fires}")


def test_fires_listed_and_the_runs_they_started(world):
    cli, api = world["cli"], world["api"]
    schedule_id, fires = fired_schedule(world)
    outcomes = [f["outcome"] for f in fires]  # newest first: on time (and any while the test ran), then late
    missed_count = outcomes.count("missed")
    assert outcomes[0] == "started" and missed_count >= 2
    assert outcomes == ["started"] * (len(outcomes) - missed_count) + ["missed"] * missed_count
    trace_id = fires[0]["trace_id"]

    table = cli("schedule", "fires", schedule_id)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    started = [line for line in lines if trace_id in line]
    assert len(started) == 1 and "started" in started[0] and fires[0]["due_at"] in started[0]
    assert fires[0]["run_status"] in started[0]
    missed = [line for line in lines if "missed" in line]  # the 3 late due times
    assert len(missed) == missed_count and all("catchup: none" in line for line in missed)
    assert "Asia/Kolkata" in table.stdout
    as_json = json.loads(cli("schedule", "fires", schedule_id, "--json").stdout)
    assert as_json == api.get(f"/workflow/schedule/{schedule_id}/fires").json()["fires"]

    first = cli("schedule", "fires", schedule_id, "--limit", "3", "--json")
    assert [f["due_at"] for f in json.loads(first.stdout)] == [f["due_at"] for f in fires[:3]]
    hint = [line for line in first.stderr.splitlines() if line.startswith("more fires: ")]
    assert len(hint) == 1, first.stderr
    older = cli(*hint[0].removeprefix("more fires: orchestra ").split(), "--json")
    assert older.returncode == 0, older.stderr
    assert [f["due_at"] for f in json.loads(older.stdout)] == [f["due_at"] for f in fires[3:]]

    shown = cli("schedule", "show", schedule_id)
    assert shown.returncode == 0, shown.stderr
    (last,) = [line for line in shown.stdout.splitlines() if line.startswith("last_fire:")]
    assert last == f"last_fire: {fires[0]['due_at']} · started · run {trace_id}"
    assert "{" not in last

    runs = cli("workflow", "list", "runs")
    assert runs.returncode == 0, runs.stderr
    (row,) = [line for line in runs.stdout.splitlines() if trace_id in line]
    assert f"schedule {schedule_id[:8]}" in row
    detail = cli("workflow", "show", trace_id)
    assert detail.returncode == 0, detail.stderr
    assert f"started by: schedule {schedule_id} (due {fires[0]['due_at']})" in detail.stdout.splitlines()

    nothing = cli("schedule", "fires", "00000000-0000-4000-8000-000000000000")
    assert nothing.returncode != 0 and "No schedule" in nothing.stderr


def test_a_run_started_directly_says_so(world):
    cli, api = world["cli"], world["api"]
    template = world["templates"]["three_step"]["template_id"]
    run = api.post("/workflow/run", json={"template_id": template, "input": "x"}).json()
    (row,) = [line for line in cli("workflow", "list", "runs").stdout.splitlines() if run["trace_id"] in line]
    assert "direct" in row and "schedule" not in row
    assert "started by: direct" in cli("workflow", "show", run["trace_id"]).stdout.splitlines()
