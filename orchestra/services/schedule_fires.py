"""The fire loop (SPEC §11): every server process runs one; together they fire each
due time of every schedule exactly once.

How exactly once holds: a schedule whose `next_due_at` has come is claimed with a row
lock (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite has one writer at a time), and in
that one transaction its due times are recorded in `schedule_fire` (unique
`(schedule_id, due_at)`), each started run is stored, and `next_due_at` moves past now
— for a batch of schedules at once, in a few statements (`Plan`).
A process killed before the commit leaves nothing behind: the next process to look
finds the schedule still due. A process killed after it leaves the runs `queued`, and
any engine claims them.

Which due times fire: those at most GRACE_SECONDS late are on time (fired whatever
`catchup` says: processing lag or a short store outage costs a delay, never a fire).
Older ones, back to `catchup_window_seconds`, were missed (every process was down, or
the store was away longer): `all` fires each, `latest` the newest of them, `none` none; those
not fired are recorded `missed`. Due times before the window are passed over.

The loop is cheap when idle: it reads the earliest `next_due_at` and sleeps until then,
holding no store connection while it sleeps. A schedule saved on any process wakes it
at once (`schedules.announce_change`: a `cache` hint on PostgreSQL); IDLE_SECONDS bounds
the sleep for a hint that was missed. A store outage is waited out with backoff; the due
times it covered are made up when the store is back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from peewee import Case, fn

from orchestra.db.models import User, WorkflowRun, utcnow
from orchestra.db.outage import StoreOutage, keep_going, release_quietly
from orchestra.db.trigger_models import ScheduleFire, WorkflowSchedule
from orchestra.engine.store import RunStore
from orchestra.engine.store.creation import NewRun
from orchestra.errors import ValidationError
from orchestra.services import audit, cron
from orchestra.services.run_access import runnable_template
from orchestra.services.shared import Shared
from orchestra.services.trigger_runs import checked_input, new_run
from orchestra.vocabulary import ACTIVE, FireOutcome

logger = logging.getLogger("orchestra.schedules")

GRACE_SECONDS = 60.0  # a due time at most this late is on time
IDLE_SECONDS = 30.0  # the longest sleep (a schedule saved elsewhere whose hint was missed is seen by then)
BATCH = 100  # schedules fired in one transaction
WRITE_CHUNK = 500  # rows in one INSERT
MOST_DUE = 1000  # due times of one schedule considered in one look (the newest)
LOCKED_RETRY_SECONDS = 0.2
RETRY_BROKEN_SECONDS = 60.0  # a schedule whose fire failed (not an outage) is tried again after


class FireLoop:
    """This process's fire loop; started and stopped by the process owner (process.py).
    `core.fire_wake` cuts its sleep short (a schedule saved here or, by a hint, elsewhere)."""

    def __init__(self, core: Shared) -> None:
        self.core = core
        self.outage: StoreOutage = core.outage
        self.task: asyncio.Task | None = None
        self._wake = core.fire_wake
        self._stopping = False
        self._broken: dict[str, float] = {}  # schedule id -> monotonic time to try it again
        self._templates: dict[tuple[str, str], Any] = {}  # (owner, template) -> runnable template, in a look
        self._submitting: set[asyncio.Task] = set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop(), name="schedule-fires")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop looking; a fire in progress finishes its transaction first."""
        self._stopping = True
        self._wake.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout=10)
            except TimeoutError:
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
        if self._submitting:  # runs not handed over stay queued: any claim loop takes them
            await asyncio.wait(set(self._submitting), timeout=5)

    async def _loop(self) -> None:
        await keep_going(self._round, what="firing schedules", db=self.core.db,
                         outage=self.outage, wake=self._wake, stopping=lambda: self._stopping)

    async def _round(self) -> float:
        claimed = await self.fire_due()
        while not self._stopping and claimed >= BATCH:  # more were due than a batch holds
            claimed = await self.fire_due()
        wait = await self._seconds_to_next_due()
        if wait <= 0.002 and claimed == 0:
            # Due, yet nothing could be claimed: another process holds those
            # schedules in its transaction now. Look again shortly, not at once.
            wait = LOCKED_RETRY_SECONDS
        return wait

    async def _seconds_to_next_due(self) -> float:
        query = (WorkflowSchedule.select(fn.MIN(WorkflowSchedule.next_due_at).alias("due"))
                 .where(WorkflowSchedule.enabled == True))  # noqa: E712
        broken = self._still_broken()
        if broken:
            query = query.where(WorkflowSchedule.id.not_in(broken))
        rows = await self.core.db.list(query.dicts())
        due = rows[0]["due"] if rows else None
        if due is None:
            return IDLE_SECONDS
        if isinstance(due, str):  # SQLite hands an aggregate back as text
            due = dt.datetime.fromisoformat(due)
        return max(0.0, min(IDLE_SECONDS, (due - utcnow()).total_seconds() + 0.002))

    async def fire_due(self, now: dt.datetime | None = None) -> int:
        """Claim up to BATCH due schedules and handle their due times, in one transaction
        of a few statements (reads for the whole batch, then bulk writes); then hand the
        started runs to the engine. How many schedules were claimed."""
        core = self.core
        now = now or utcnow()
        self._templates = {}
        async with core.write_transaction():
            query = (WorkflowSchedule.select()
                     .where((WorkflowSchedule.enabled == True)  # noqa: E712
                            & (WorkflowSchedule.next_due_at <= now))
                     .order_by(WorkflowSchedule.next_due_at).limit(BATCH))
            broken = self._still_broken()
            if broken:
                query = query.where(WorkflowSchedule.id.not_in(broken))
            if core.is_postgres:
                query = query.for_update(skip_locked=True)
            rows = await core.db.list(query)
            plan = await self._plan(rows, now) if rows else Plan()
            stored = await plan.write(core.db, core.engine.store, postgres=core.is_postgres)
            await _audit_starts(core, stored)
        await release_quietly(core.db)
        if rows:
            logger.debug("fired %d schedule(s): %d run(s) started", len(rows), len(plan.started))
        for trace_id in plan.cancels:
            asyncio.get_running_loop().create_task(
                core.engine.cancel(trace_id, reason="A later fire of its schedule replaced it (overlap: cancel_previous)."))
        if plan.started:  # the next batch is fired meanwhile
            task = asyncio.get_running_loop().create_task(self._submit(plan.started))
            self._submitting.add(task)
            task.add_done_callback(self._submitting.discard)
        return len(rows)

    def _still_broken(self) -> list[str]:
        moment = time.monotonic()
        for schedule_id in [k for k, until in self._broken.items() if until <= moment]:
            del self._broken[schedule_id]
        return list(self._broken)

    async def _submit(self, trace_ids: list[str]) -> None:
        """Hand queued runs to the engine, claimed and started together (a failure leaves
        them queued: any claim loop takes them)."""
        try:
            await self.core.engine.submit_many(trace_ids)
        except Exception as exc:  # noqa: BLE001 - the runs stay queued for any claim loop
            if not self.outage.failed(exc, "starting scheduled runs"):
                logger.exception("could not hand %d scheduled runs to the engine", len(trace_ids))

    def _due_times(self, row: WorkflowSchedule, now: dt.datetime) -> tuple[Any, list[dt.datetime], set, Any]:
        """(zone, due times not yet passed over, those to fire, the next due time) of `row`."""
        tz = cron.zone(row.timezone)
        on_time_from = now - dt.timedelta(seconds=GRACE_SECONDS)
        window_from = now - dt.timedelta(seconds=row.catchup_window_seconds)
        start = max(row.next_due_at, min(on_time_from, window_from))
        due, following = cron.due_between(row.cron, tz, start.replace(tzinfo=cron.UTC),
                                          now.replace(tzinfo=cron.UTC), MOST_DUE)
        due = [d for d in (cron.to_naive_utc(d) for d in due) if d >= row.next_due_at]
        late = [d for d in due if d < on_time_from]
        chosen = {d for d in due if d >= on_time_from}
        if row.catchup == "all":
            chosen.update(late)
        elif row.catchup == "latest":
            chosen.update(late[-1:])
        return tz, due, chosen, None if following is None else cron.to_naive_utc(following)

    async def _template(self, row: WorkflowSchedule) -> Any:
        key = (row.owner_id, row.template_id)
        if key not in self._templates:  # one read per template and owner in a look
            self._templates[key] = await runnable_template(self.core, user_id=row.owner_id,
                                                           template_id=row.template_id)
        return self._templates[key]

    async def _plan(self, rows: list[WorkflowSchedule], now: dt.datetime) -> Plan:
        """Decide every due time of `rows`: which fire (and their runs), which are skipped,
        missed or failed. Reads what the whole batch needs at once."""
        plan = Plan()
        timing = {}
        for row in rows:
            try:
                timing[row.id] = self._due_times(row, now)
            except Exception:  # noqa: BLE001 - one schedule must not hold up the others
                logger.exception("schedule %s could not be fired; trying again in %.0f s", row.id,
                                 RETRY_BROKEN_SECONDS)
                # Only this process's note: its due times stay due (made up per catch-up
                # once it can fire), and every other schedule goes on meanwhile.
                self._broken[row.id] = time.monotonic() + RETRY_BROKEN_SECONDS
        rows = [row for row in rows if row.id in timing]
        if not rows:
            return plan
        handled = set(await self.core.db.list(
            ScheduleFire.select(ScheduleFire.schedule, ScheduleFire.due_at)
            .where(ScheduleFire.schedule.in_([r.id for r in rows])
                   & (ScheduleFire.due_at >= min(r.next_due_at for r in rows))).tuples()))
        last_runs = [r.last_trace_id for r in rows if r.last_trace_id and r.overlap != "allow"]
        active = set()
        if last_runs:
            active = {t for (t,) in await self.core.db.list(
                WorkflowRun.select(WorkflowRun.trace_id)
                .where(WorkflowRun.trace_id.in_(last_runs) & WorkflowRun.status.in_(list(ACTIVE))).tuples())}
        for row in rows:
            tz, due, chosen, next_due = timing[row.id]
            last = row.last_trace_id
            for due_at in due:
                if (row.id, due_at) in handled:
                    continue
                if due_at not in chosen:
                    plan.fire(row, due_at, FireOutcome.MISSED, error=f"missed while no process could fire it (catchup: {row.catchup})")
                    continue
                previous = last if row.overlap != "allow" and last in active else None
                if previous is not None and row.overlap == "skip":
                    plan.fire(row, due_at, FireOutcome.SKIPPED, error=f"run {previous} was still active (overlap: skip)")
                    continue
                trace_id = await self._start(plan, row, tz, due_at)
                if trace_id is None:
                    continue
                if previous is not None:  # overlap: cancel_previous
                    plan.cancels.append(previous)
                    active.discard(previous)
                active.add(trace_id)
                last = trace_id
            plan.schedules[row.id] = (next_due, last)
        return plan

    async def _start(self, plan: Plan, row: WorkflowSchedule, tz: Any, due_at: dt.datetime) -> str | None:
        """Plan the run of one due time; None (recorded `failed`) when it cannot start."""
        template = await self._template(row)
        if template is None:
            plan.fire(row, due_at, FireOutcome.FAILED, error="the schedule's owner may not run its template")
            return None
        try:
            input_text, input_value = await checked_input(self.core, template, row.input)
        except ValidationError as exc:
            plan.fire(row, due_at, FireOutcome.FAILED, error=exc.message[:1000])
            return None
        trigger = {"kind": "schedule", "schedule_id": row.id, "due_at": cron.iso_in(due_at, tz)}
        new = new_run(owner_id=row.owner_id, template=template, input_text=input_text,
                      input_value=input_value, trigger=trigger)
        trace_id = new.trace_id
        plan.runs.append(new)
        plan.fire(row, due_at, FireOutcome.STARTED, trace_id=trace_id)
        plan.started.append(trace_id)
        return trace_id


async def _audit_starts(core: Shared, started: list[WorkflowRun]) -> None:
    """Each started run's `run.start` entry (SPEC §16), by its schedule for its owner, in
    the fire's transaction: a few statements for the whole batch."""
    if not started:
        return
    owners = {run.owner_id for run in started}
    names = dict(await core.db.list(User.select(User.id, User.user_name).where(User.id.in_(sorted(owners))).tuples()))
    await audit.record_many(core, [audit.Pending(
        action="run.start", target=audit.target("run", run.trace_id, run.template_name),
        changes=audit.diff({}, {"status": run.status, "template_id": run.template_id,
                                "template_version": run.template_version, "trigger": run.trigger}),
        workspace_id=audit.workspace_of(run),
        actor=audit.Actor(run.owner_id, names.get(run.owner_id), via="schedule")) for run in started])


@dataclass
class Plan:
    """What one look decided, written by `write` in a few statements."""

    runs: list[NewRun] = field(default_factory=list)
    fires: list[dict[str, Any]] = field(default_factory=list)
    schedules: dict[str, tuple[dt.datetime | None, str | None]] = field(default_factory=dict)
    cancels: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)

    def fire(self, row: WorkflowSchedule, due_at: dt.datetime, outcome: FireOutcome, *,
             trace_id: str | None = None, error: str | None = None) -> None:
        self.fires.append({"schedule": row.id, "due_at": due_at, "outcome": outcome,
                           "trace_id": trace_id, "error": error, "fired_at": utcnow()})

    async def write(self, db: Any, store: RunStore, *, postgres: bool) -> list[WorkflowRun]:
        """Every row the look decided; the runs as stored."""
        # a burst: stored queued, then claimed and started together (Engine.submit_many)
        stored = await store.create(self.runs)
        for at in range(0, len(self.fires), WRITE_CHUNK):
            await db.aexecute(ScheduleFire.insert_many(self.fires[at:at + WRITE_CHUNK]))
        if self.cancels:
            await db.aexecute(WorkflowRun.update(cancel_requested=True).where(
                WorkflowRun.trace_id.in_(self.cancels)))
        if self.schedules:
            ids = list(self.schedules)
            if postgres:  # a CASE of parameters is text to PostgreSQL: ISO text, cast
                next_due = Case(WorkflowSchedule.id, [(i, _iso(self.schedules[i][0])) for i in ids]).cast("timestamp")
            else:
                next_due = Case(WorkflowSchedule.id, [(i, WorkflowSchedule.next_due_at.db_value(self.schedules[i][0]))
                                                      for i in ids])
            await db.aexecute(WorkflowSchedule.update(
                next_due_at=next_due,
                last_trace_id=Case(WorkflowSchedule.id, [(i, self.schedules[i][1]) for i in ids]),
            ).where(WorkflowSchedule.id.in_(ids)))
        return stored


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
