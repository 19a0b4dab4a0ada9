"""The fire loop (SPEC §11): every server process runs one; together they fire each
due time of every schedule exactly once.

How exactly once holds: a schedule whose `next_due_at` has come is claimed with a row
lock (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite has one writer at a time), and in
that one transaction its due times are recorded in `schedule_fire` (unique
`(schedule_id, due_at)`), each started run is stored, and `next_due_at` moves past now.
A process killed before the commit leaves nothing behind: the next process to look
finds the schedule still due. A process killed after it leaves the runs `queued`, and
any engine claims them.

Which due times fire: those at most GRACE_SECONDS late are on time (fired whatever
`catchup` says: processing lag or a short store outage costs a delay, never a fire).
Older ones, back to `catchup_window_seconds`, were missed (every process was down, or
the store was away longer): `all` fires each, `latest` the newest of them, `none` none; those
not fired are recorded `missed`. Due times before the window are passed over.

The loop is cheap when idle: it reads the earliest `next_due_at` and sleeps until then
(at most IDLE_SECONDS, so a schedule saved on another process is seen), holding no
store connection while it sleeps. A store outage is waited out with backoff; the due
times it covered are made up when the store is back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from peewee import fn

from orchestra.core import Core
from orchestra.db.models import WorkflowRun, utcnow
from orchestra.db.outage import StoreOutage, backoff, release_quietly
from orchestra.db.trigger_models import ScheduleFire, WorkflowSchedule
from orchestra.engine.vocabulary import ACTIVE
from orchestra.errors import ValidationError
from orchestra.services import cron
from orchestra.services.run_access import runnable_template
from orchestra.services.trigger_runs import checked_input, store_run

logger = logging.getLogger("orchestra.schedules")

GRACE_SECONDS = 60.0  # a due time at most this late is on time
IDLE_SECONDS = 30.0  # the longest sleep (schedules saved on other processes are seen by then)
BATCH = 25  # schedules fired in one transaction
MOST_DUE = 1000  # due times of one schedule considered in one look (the newest)
SUBMIT_CONCURRENCY = 8
LOCKED_RETRY_SECONDS = 0.2


class FireLoop:
    """This process's fire loop; owned by the server's lifecycle (web/app.py)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.outage: StoreOutage = core.extras.setdefault("store_outage", StoreOutage())
        self.task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._stopping = False

    def start(self) -> None:
        self.core.extras["schedule_fire_loop"] = self
        self.task = asyncio.get_running_loop().create_task(self._loop(), name="schedule-fires")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop looking; a fire in progress finishes its transaction first."""
        self._stopping = True
        self._wake.set()
        self.core.extras.pop("schedule_fire_loop", None)
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout=10)
            except TimeoutError:
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)

    async def _loop(self) -> None:
        failures = 0
        while not self._stopping:
            self._wake.clear()
            try:
                claimed = await self.fire_due()
                while not self._stopping and claimed >= BATCH:  # more were due than a batch holds
                    claimed = await self.fire_due()
                wait = await self._seconds_to_next_due()
                if wait <= 0.002 and claimed == 0:
                    # Due, yet nothing could be claimed: another process holds those
                    # schedules in its transaction now. Look again shortly, not at once.
                    wait = LOCKED_RETRY_SECONDS
                self.outage.succeeded()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one look
                failures += 1
                if not self.outage.failed(exc, "firing schedules"):
                    logger.exception("firing schedules failed")
                wait = backoff(failures, cap=5.0)
            finally:
                await release_quietly(self.core.db)
            if self._stopping:
                break
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _seconds_to_next_due(self) -> float:
        rows = await self.core.db.list(
            WorkflowSchedule.select(fn.MIN(WorkflowSchedule.next_due_at).alias("due"))
            .where(WorkflowSchedule.enabled == True).dicts())  # noqa: E712
        due = rows[0]["due"] if rows else None
        if due is None:
            return IDLE_SECONDS
        if isinstance(due, str):  # SQLite hands an aggregate back as text
            due = dt.datetime.fromisoformat(due)
        return max(0.0, min(IDLE_SECONDS, (due - utcnow()).total_seconds() + 0.002))

    async def fire_due(self, now: dt.datetime | None = None) -> int:
        """Claim up to BATCH due schedules and handle their due times, in one transaction;
        then hand the started runs to the engine. How many schedules were claimed."""
        core = self.core
        now = now or utcnow()
        started: list[str] = []
        cancels: list[str] = []
        async with core.write_transaction():
            query = (WorkflowSchedule.select()
                     .where((WorkflowSchedule.enabled == True)  # noqa: E712
                            & (WorkflowSchedule.next_due_at <= now))
                     .order_by(WorkflowSchedule.next_due_at).limit(BATCH))
            if core.is_postgres:
                query = query.for_update(skip_locked=True)
            rows = await core.db.list(query)
            for row in rows:
                await self._handle(row, now, started, cancels)
        await release_quietly(core.db)
        if rows:
            logger.debug("fired %d schedule(s): %d run(s) started", len(rows), len(started))
        for trace_id in cancels:
            asyncio.get_running_loop().create_task(
                core.engine.cancel(trace_id, reason="A later fire of its schedule replaced it (overlap: cancel_previous)."))
        await self._submit(started)
        return len(rows)

    async def _submit(self, trace_ids: list[str]) -> None:
        """Hand queued runs to the engine (a failure leaves them queued: claimed later)."""
        gate = asyncio.Semaphore(SUBMIT_CONCURRENCY)

        async def submit(trace_id: str) -> None:
            async with gate:
                try:
                    await self.core.engine.submit(trace_id)
                except Exception as exc:  # noqa: BLE001 - the run stays queued for any claim loop
                    if not self.outage.failed(exc, "starting a scheduled run"):
                        logger.exception("could not hand scheduled run %s to the engine", trace_id)

        await asyncio.gather(*(submit(t) for t in trace_ids))

    async def _handle(self, row: WorkflowSchedule, now: dt.datetime, started: list[str],
                      cancels: list[str]) -> None:
        """Record and fire `row`'s due times up to `now`; move `next_due_at` past now."""
        tz = cron.zone(row.timezone)
        aware_now = now.replace(tzinfo=cron.UTC)
        on_time_from = now - dt.timedelta(seconds=GRACE_SECONDS)
        window_from = now - dt.timedelta(seconds=row.catchup_window_seconds)
        start = max(row.next_due_at, min(on_time_from, window_from))
        due, following = cron.due_between(row.cron, tz, start.replace(tzinfo=cron.UTC), aware_now, MOST_DUE)
        due = [d for d in (cron.to_naive_utc(d) for d in due) if d >= row.next_due_at]
        late = [d for d in due if d < on_time_from]
        chosen = {d for d in due if d >= on_time_from}
        if row.catchup == "all":
            chosen.update(late)
        elif row.catchup == "latest":
            chosen.update(late[-1:])
        for due_at in due:
            if due_at in chosen:
                await self._fire(row, tz, due_at, started, cancels)
            else:
                await self._record(row, due_at, "missed", error="missed while no process could fire it "
                                   f"(catchup: {row.catchup})")
        next_due = None if following is None else cron.to_naive_utc(following)
        await self.core.db.aexecute(WorkflowSchedule.update(
            next_due_at=next_due, last_trace_id=row.last_trace_id).where(WorkflowSchedule.id == row.id))

    async def _record(self, row: WorkflowSchedule, due_at: dt.datetime, outcome: str, *,
                      trace_id: str | None = None, error: str | None = None) -> bool:
        """Insert the fire record unless this due time has one; whether it was inserted."""
        exists = await ScheduleFire.aget_or_none(
            (ScheduleFire.schedule == row.id) & (ScheduleFire.due_at == due_at))
        if exists is not None:
            return False
        await ScheduleFire.acreate(schedule=row.id, due_at=due_at, outcome=outcome,
                                   trace_id=trace_id, error=error)
        return True

    async def _previous_active(self, row: WorkflowSchedule) -> str | None:
        if not row.last_trace_id:
            return None
        run = await WorkflowRun.aget_or_none(
            (WorkflowRun.trace_id == row.last_trace_id) & WorkflowRun.status.in_(list(ACTIVE)))
        return None if run is None else run.trace_id

    async def _fire(self, row: WorkflowSchedule, tz: Any, due_at: dt.datetime, started: list[str],
                    cancels: list[str]) -> None:
        if await ScheduleFire.aget_or_none(
                (ScheduleFire.schedule == row.id) & (ScheduleFire.due_at == due_at)) is not None:
            return  # handled already
        previous = await self._previous_active(row) if row.overlap != "allow" else None
        if previous is not None and row.overlap == "skip":
            await self._record(row, due_at, "skipped", error=f"run {previous} was still active (overlap: skip)")
            return
        template = await runnable_template(self.core, user_id=row.owner_id, template_id=row.template_id)
        if template is None:
            await self._record(row, due_at, "failed", error="the schedule's owner may not run its template")
            return
        try:
            input_text, input_value = await checked_input(self.core, template, row.input)
        except ValidationError as exc:
            await self._record(row, due_at, "failed", error=exc.message[:1000])
            return
        trigger = {"kind": "schedule", "schedule_id": row.id, "due_at": cron.iso_in(due_at, tz)}
        run = await store_run(owner_id=row.owner_id, template=template, input_text=input_text,
                              input_value=input_value, trigger=trigger)
        await self._record(row, due_at, "started", trace_id=run.trace_id)
        if previous is not None:  # overlap: cancel_previous
            await self.core.db.aexecute(WorkflowRun.update(cancel_requested=True).where(
                WorkflowRun.trace_id == previous))
            cancels.append(previous)
        row.last_trace_id = run.trace_id
        started.append(run.trace_id)
