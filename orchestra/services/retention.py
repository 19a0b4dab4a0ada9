"""Retention (SPEC §10): runs that ended long ago, with everything stored under them,
and refresh tokens past their expiry, are deleted (and audit entries past
`ORCHESTRA_AUDIT_RETENTION_DAYS`, services/audit_chain.py) — by a timer in the server
(`ORCHESTRA_RUN_RETENTION_DAYS`, at start and then hourly) or by `orchestra db prune`.

Deletes go in small batches, each its own short write transaction, so a prune of a
million events never holds the store's write lock (SQLite) or a long transaction
(PostgreSQL) while runs go on. On PostgreSQL each batch first takes a transaction-level
advisory lock without waiting: when another process is pruning, this one stops its
round, so one process at a time does the work. Only runs with a `finished_at` (they
ended) older than the cut-off are touched; running, queued and waiting runs never are.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
from dataclasses import dataclass

from peewee import ModelSelect

from orchestra.db.database import release_connection
from orchestra.db.models import WorkflowRun, utcnow
from orchestra.services import audit_chain, run_starts, trigger_retention
from orchestra.services.auth import prune_expired_tokens
from orchestra.services.shared import Shared

logger = logging.getLogger("orchestra.retention")

BATCH = 200  # runs per transaction
PERIOD_SECONDS = 3600.0
ADVISORY_KEY = 0x6F726368  # "orch": the retention lock on PostgreSQL
_AGE = re.compile(r"^\s*(\d{1,6})\s*([dhm])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


@dataclass(frozen=True)
class Pruned:
    runs: int
    tokens: int
    skipped: bool = False  # another process holds the retention lock


def parse_age(text: str) -> dt.timedelta:
    """`30d`, `12h`, `90m` (`0d` too) as a timedelta; ValueError for anything else."""
    match = _AGE.match(text or "")
    if match is None:
        raise ValueError(f"{text!r} is not an age: use a whole number and d, h or m (30d, 12h, 90m)")
    return dt.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _run_children() -> list:
    """Every model whose rows belong to a run (steps, events, and any later table with a
    foreign key to workflow_run), so nothing is orphaned whatever the store's cascades."""
    return [fk.model for fk in WorkflowRun._meta.backrefs]


def _ended_before(cutoff: dt.datetime) -> ModelSelect:
    return (
        WorkflowRun.select(WorkflowRun.trace_id)
        .where(WorkflowRun.finished_at.is_null(False) & (WorkflowRun.finished_at < cutoff))
        .order_by(WorkflowRun.finished_at)
    )


async def _delete_batch(core: Shared, cutoff: dt.datetime, batch: int) -> int | None:
    """Delete up to `batch` ended runs and their rows in one transaction; the number
    deleted, or None when another process holds the retention lock."""
    async with core.write_transaction():
        if core.is_postgres:
            sql = f"SELECT pg_try_advisory_xact_lock({ADVISORY_KEY})"
            if not await core.db.run(lambda: core.db.execute_sql(sql).fetchone()[0]):
                return None
        ids = [row.trace_id for row in await core.db.list(_ended_before(cutoff).limit(batch))]
        if not ids:
            return 0
        for child in _run_children():
            fk = next(f for f in child._meta.refs if f.rel_model is WorkflowRun)
            await core.db.aexecute(child.delete().where(fk.in_(ids)))
        await core.db.aexecute(WorkflowRun.delete().where(WorkflowRun.trace_id.in_(ids)))
        return len(ids)


async def prune_runs(
    core: Shared, *, older_than: dt.timedelta, now: dt.datetime | None = None, batch: int = BATCH,
    stop: asyncio.Event | None = None,
) -> int | None:
    """Delete runs that ended more than `older_than` before `now`; how many (None: another
    process is pruning). `stop` set: no further batch is started."""
    cutoff = (now or utcnow()) - older_than
    total = 0
    while stop is None or not stop.is_set():
        deleted = await _delete_batch(core, cutoff, batch)
        await release_connection(core.db)
        if deleted is None:
            return None if total == 0 else total
        total += deleted
        if deleted < batch:
            return total
        await asyncio.sleep(0)  # let requests in between batches
    return total


async def prune(
    core: Shared, *, older_than: dt.timedelta | None, now: dt.datetime | None = None,
    stop: asyncio.Event | None = None,
) -> Pruned:
    """One round: ended runs older than `older_than` (None: keep every run), expired
    refresh tokens, and remembered starts past their 24 hours."""
    runs = 0 if older_than is None else await prune_runs(core, older_than=older_than, now=now, stop=stop)
    if older_than is not None:  # schedules' fire records and ended webhook deliveries of that age
        await trigger_retention.prune(core, cutoff=(now or utcnow()) - older_than)
    tokens = await prune_expired_tokens(core, now=now)
    await run_starts.prune(core, now=now)  # idempotency keys and webhook ids past 24 h
    if core.settings.audit_retention_days > 0:  # SPEC §16: whole old prefixes of each chain
        await audit_chain.prune(core, older_than=dt.timedelta(days=core.settings.audit_retention_days), now=now)
    await release_connection(core.db)
    return Pruned(runs=runs or 0, tokens=tokens, skipped=runs is None)


class RetentionTimer:
    """The server's retention: a round at start, then one every PERIOD_SECONDS. Stopping
    lets a round's current batch finish (a store statement is never cancelled midway)."""

    def __init__(self, core: Shared, *, period: float = PERIOD_SECONDS) -> None:
        self.core = core
        self.period = period
        self.task: asyncio.Task | None = None
        self.first_round = asyncio.Event()  # set once the round at start is over
        self._stopping = asyncio.Event()

    @property
    def older_than(self) -> dt.timedelta | None:
        days = self.core.settings.run_retention_days
        return dt.timedelta(days=days) if days > 0 else None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop(), name="orchestra-retention")

    async def stop(self) -> None:
        self._stopping.set()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                done = await prune(self.core, older_than=self.older_than, stop=self._stopping)
                if done.runs or done.tokens:
                    logger.info("retention: deleted %d run(s) and %d expired refresh token(s)",
                                done.runs, done.tokens)
            except Exception:  # a store outage: the next round tries again
                logger.warning("retention round failed; retrying in %.0f s", self.period, exc_info=True)
            self.first_round.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.period)
