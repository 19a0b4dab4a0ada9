"""Retention (SPEC §10) on both stores: it deletes ended runs past the cut-off with their
steps and events, and expired refresh tokens — and nothing else."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from orchestra.db.models import (
    RefreshToken,
    RunEvent,
    RunStep,
    Upload,
    User,
    WorkflowRun,
    WorkflowTemplate,
)
from orchestra.services import auth, retention

NOW = dt.datetime(2026, 6, 1, 12, 0, 0)
DAY = dt.timedelta(days=1)


@pytest.fixture
def database_url(both_stores: str) -> str:
    return both_stores


async def add_run(owner: str, name: str, status: str, finished_ago: dt.timedelta | None,
                  created_ago: dt.timedelta = dt.timedelta(days=400)) -> str:
    trace_id = f"run-{name}"
    await WorkflowRun.acreate(
        trace_id=trace_id, owner=owner, template_name="t", steps=[], status=status,
        created_at=NOW - created_ago, finished_at=None if finished_ago is None else NOW - finished_ago,
    )
    await RunStep.acreate(run=trace_id, step_id="a", status="succeeded", output="x")
    await RunEvent.insert_many([dict(run=trace_id, seq=s, kind="token", data={"text": "x"})
                                for s in (1, 2, 3)]).aexecute()
    return trace_id


async def rows(query) -> list:
    return await query.model._meta.database.list(query)


async def remaining() -> tuple[set[str], set[str], set[str]]:
    runs = {r.trace_id for r in await rows(WorkflowRun.select())}
    steps = {r.run_id for r in await rows(RunStep.select())}
    events = {r.run_id for r in await rows(RunEvent.select())}
    return runs, steps, events


@pytest.fixture
async def alice(core):
    return (await auth.register(core, user_name="alice", password="password-123")).id


async def test_ended_runs_past_the_cut_off_go_with_their_rows(core, alice):
    old = [await add_run(alice, f"old-{s}", s, 31 * DAY) for s in ("succeeded", "failed", "cancelled", "interrupted")]
    recent = await add_run(alice, "recent", "succeeded", 29 * DAY)
    edge = await add_run(alice, "edge", "succeeded", 30 * DAY - dt.timedelta(seconds=1))
    running = await add_run(alice, "running", "running", None)
    queued = await add_run(alice, "queued", "queued", None)
    waiting = await add_run(alice, "waiting", "waiting_reply", None)
    template = await WorkflowTemplate.acreate(owner=alice, name="keep", name_key="keep", steps=[])
    upload = await Upload.acreate(owner=alice, filename="a", size=1, content_type="text/plain", sha256="0" * 64)

    deleted = await retention.prune_runs(core, older_than=30 * DAY, now=NOW, batch=3)

    assert deleted == len(old)
    kept = {recent, edge, running, queued, waiting}
    assert await remaining() == (kept, kept, kept)
    assert await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template.id) is not None
    assert await Upload.aget_or_none(Upload.id == upload.id) is not None
    assert await User.aget_or_none(User.id == alice) is not None


async def test_zero_age_takes_every_ended_run_and_no_live_one(core, alice):
    done = await add_run(alice, "done", "succeeded", dt.timedelta(seconds=1))
    live = await add_run(alice, "live", "running", None)
    assert await retention.prune_runs(core, older_than=dt.timedelta(0), now=NOW) == 1
    assert (await remaining())[0] == {live}
    assert done not in (await remaining())[2]


async def test_expired_refresh_tokens_are_pruned_and_live_ones_kept(core, alice):
    await RefreshToken.insert_many([
        dict(jti="expired", family="f", user=alice, expires_at=NOW - dt.timedelta(seconds=1)),
        dict(jti="live", family="f", user=alice, expires_at=NOW + DAY),
    ]).aexecute()
    pruned = await retention.prune(core, older_than=None, now=NOW)
    assert pruned == retention.Pruned(runs=0, tokens=1)
    assert {t.jti for t in await rows(RefreshToken.select())} == {"live"}


async def test_without_an_age_no_run_is_touched(core, alice):
    old = await add_run(alice, "old", "succeeded", 900 * DAY)
    assert (await retention.prune(core, older_than=None, now=NOW)).runs == 0
    assert (await remaining())[0] == {old}


@pytest.mark.parametrize(("text", "age"), [
    ("30d", dt.timedelta(days=30)), ("12h", dt.timedelta(hours=12)), ("90m", dt.timedelta(minutes=90)),
    ("0d", dt.timedelta(0)), (" 7d ", dt.timedelta(days=7)),
])
def test_ages(text, age):
    assert retention.parse_age(text) == age


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "1.5d", "30s", "1w", "10 days", "9999999d"])
def test_bad_ages(text):
    with pytest.raises(ValueError):
        retention.parse_age(text)


@pytest.mark.parametrize("both_stores", ["postgres"], indirect=True)  # SQLite serves one process
async def test_one_process_at_a_time_on_postgresql(core, alice, database_url):
    import asyncpg

    assert core.is_postgres

    old = await add_run(alice, "old", "succeeded", 90 * DAY)
    other = await asyncpg.connect(database_url)
    try:  # another process is pruning: it holds the lock
        await other.execute(f"SELECT pg_advisory_lock({retention.ADVISORY_KEY})")
        pruned = await retention.prune(core, older_than=30 * DAY, now=NOW)
        assert pruned.skipped and pruned.runs == 0
        assert (await remaining())[0] == {old}
        await other.execute(f"SELECT pg_advisory_unlock({retention.ADVISORY_KEY})")
        assert (await retention.prune(core, older_than=30 * DAY, now=NOW)).runs == 1
    finally:
        await other.close()


async def test_the_server_prunes_at_start(settings):
    """A server started with ORCHESTRA_RUN_RETENTION_DAYS deletes old ended runs at once."""
    from dataclasses import replace

    from orchestra.core import Core
    from orchestra.db.models import utcnow
    from tests.conftest import running_app

    store = await Core.open(settings)
    try:
        owner = (await auth.register(store, user_name="alice", password="password-123")).id
        now = utcnow()
        old = await add_run(owner, "old", "succeeded", None)
        await WorkflowRun.update(finished_at=now - 40 * DAY).where(WorkflowRun.trace_id == old).aexecute()
        fresh = await add_run(owner, "fresh", "succeeded", None)
        await WorkflowRun.update(finished_at=now - DAY).where(WorkflowRun.trace_id == fresh).aexecute()
    finally:
        await store.close()
    async with running_app(replace(settings, run_retention_days=30)) as client:
        await asyncio.wait_for(client.app.ctx.process.retention.first_round.wait(), 60)
        assert (await remaining()) == ({fresh}, {fresh}, {fresh})
