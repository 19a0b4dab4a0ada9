"""Claims and leases: which runs this process executes, and keeping them.

Runs are a queue in the store. A claim loop takes runs nobody holds — queued ones, and
those whose owner's lease ran out (the owner died) — while there is room (`max_runs`);
a lease loop renews this process's leases, drops runs another process holds now, and
picks up cancels and answers given elsewhere. Signals (`control`: wake, cancel, reply)
are hints that make both act sooner. A run's lease lost, or its cancel seen, is here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Coroutine
from typing import Any

import pydantic

from orchestra.db.models import WorkflowRun
from orchestra.db.outage import StoreOutage, sleep_backoff
from orchestra.engine.live import CANCELLED_BY_REQUEST, LiveRun, LiveRuns
from orchestra.engine.model import RunOptions, StopReason, step_defs
from orchestra.engine.questions import Questions
from orchestra.engine.run_task import RunTasks
from orchestra.engine.store import RunStore
from orchestra.engine.store.events import RunGone
from orchestra.engine.writer import RunWriter
from orchestra.observability import metrics
from orchestra.observability import runs as observe
from orchestra.settings import Settings

logger = logging.getLogger("orchestra.engine")


class Claims:
    """The claim loop, the lease loop, launching claimed runs, and `control` signals."""

    def __init__(self, settings: Settings, *, store: RunStore, runs: LiveRuns, tasks: RunTasks,
                 questions: Questions, outage: StoreOutage) -> None:
        self.settings = settings
        self.store = store
        self.runs = runs
        self.tasks = tasks
        self.questions = questions
        self.outage = outage
        self._loops: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()  # reply checks the signals started

    # -- launching ------------------------------------------------------------------------
    def launch(self, run: WorkflowRun, *, cancel_message: str = CANCELLED_BY_REQUEST,
               fresh: bool = False) -> LiveRun:
        """Start the task of a run just claimed (its row as claimed). A run whose cancel
        was requested ends at once, `cancelled` with `cancel_message`. `fresh`: stored
        by this process just now (LiveRun.fresh)."""
        return self._go(self._live(run, cancel_message, fresh=fresh))

    async def take(self, trace_ids: list[str], *, attempt: bool = True,
                   owners: dict[str, str] | None = None) -> list[str]:
        """Claim and start runs nobody holds, as many as there is room for, together: one
        claim statement, the fresh ones' `run_started` in one transaction, then their
        tasks — a burst of runs (a minute's schedule fires) starts without a round of the
        store per run. Room is `max_runs` and, for each owner, `max_per_user` (`owners`:
        each run's owner, read here when not given). The trace ids taken here."""
        wanted = [t for t in dict.fromkeys(trace_ids) if t not in self.runs]
        if not wanted or self.runs.room <= 0:
            return []
        if owners is None:
            owners = await self.store.owners(wanted) if self.runs.max_per_user else dict.fromkeys(wanted, "")
        take = self.runs.fit({t: owners[t] for t in wanted if t in owners})
        if not take:
            return []
        with self.runs.reserving([owners[t] for t in take]):
            runs = await self.claim_many(take, attempt=attempt)
            lives = [self._live(run, CANCELLED_BY_REQUEST) for run in runs]
            for live in lives:
                self.store.hold(live.trace_id, live.claim)
            try:
                await self.tasks.begin_many(lives)
            finally:  # claimed: they run here whatever happened (a run not begun begins itself)
                for live in lives:
                    self._go(live)
        return [live.trace_id for live in lives]

    def _live(self, run: WorkflowRun, cancel_message: str, *, fresh: bool = False) -> LiveRun:
        try:
            steps, unreadable = step_defs(run.steps or []), None
        except pydantic.ValidationError as exc:  # stored by an older, looser release
            steps, unreadable = (), f"The run's steps cannot be read: {exc.errors()[0]['msg']}."
        live = LiveRun(
            run.trace_id, run.owner_id,
            run.input_value if "input_schema" in (run.spec or {}) else (run.input or ""),
            list(run.files or []), steps, attempt=run.attempts, unreadable=unreadable,
            options=RunOptions.from_spec(run.spec),
            started_epoch=(run.started_at.replace(tzinfo=dt.UTC).timestamp()
                           if run.started_at else None),
            claim=run.owner_process, forked_from=run.forked_from,
            budget_pusd=run.budget_pusd, parent_trace_id=run.parent_trace_id, fresh=fresh,
            workspace_id=run.workspace_id,
            trace_parent=run.trace_parent,
            writes=RunWriter(retry=self._write_failed, release=self.store.release),
        )
        if run.cancel_requested:
            live.stop_asked, live.stop_message, live.tree_cancelled = True, cancel_message, True
        return live

    def _go(self, live: LiveRun) -> LiveRun:
        """The run executes here from now on: its task starts."""
        live.renewed_at = asyncio.get_running_loop().time()
        self.runs.add(live)
        self.store.hold(live.trace_id, live.claim)
        live.task = asyncio.get_running_loop().create_task(
            observe.observed_run(live.trace_id, live.trace_parent, live.attempt, self.tasks.run(live)),
            name=f"run-{live.trace_id}",
        )
        return live

    async def claim(self, trace_id: str, *, attempt: bool = True) -> WorkflowRun | None:
        """Claim a run to execute here: its row, or None when another process holds it
        or this one began stopping while the claim was in flight."""
        runs = await self.claim_many([trace_id], attempt=attempt)
        return runs[0] if runs else None

    async def claim_many(self, trace_ids: list[str], *, attempt: bool = True) -> list[WorkflowRun]:
        """`claim` for several runs in one statement: the rows of those taken. A run
        claimed while this process began stopping could miss the hand-back and be left
        to its lease, and its next claim would count as an attempt: it is given back at
        once instead."""
        runs = await self.store.claim_many(trace_ids, attempt=attempt)
        if runs and self.runs.stopping:
            for run in runs:
                await self.store.hand_back(run.trace_id, run.owner_process)
            return []
        return runs

    async def _write_failed(self, exc: BaseException, tries: int) -> bool:
        """A run's write failed: while the store is unreachable, wait (capped backoff
        with jitter) and try again — the run keeps what it has; anything else fails it."""
        if isinstance(exc, RunGone) or not self.outage.failed(exc, "writing a run's events"):
            return False
        await self.store.release()
        await sleep_backoff(tries)
        return True

    # -- the loops --------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._claim_loop(), name="run-claims"),
                       loop.create_task(self._lease_loop(), name="run-leases")]

    async def stop(self) -> None:
        """End the loops and the reply checks still running."""
        tasks = [*self._loops, *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops = []

    async def _claim_loop(self) -> None:
        every = max(0.2, min(self.settings.run_lease_seconds / 3, 5.0))
        while not self.runs.stopping:
            try:
                await self._claim_some()
                self.outage.succeeded()
                metrics.store_available()
            except Exception as exc:  # noqa: BLE001 - the store may be briefly away: try again
                metrics.store_unavailable()
                if not self.outage.failed(exc, "claiming runs"):
                    logger.exception("claiming runs failed")
            await self.store.release()
            await self.runs.wait_for_wake(every)

    async def _claim_some(self) -> None:
        room = self.runs.room
        if room <= 0:
            return
        found = await self.store.candidates(room, per_user=self.runs.max_per_user,
                                            busy=self.runs.busy_by_owner())
        owners = {trace_id: owner for trace_id, owner in found if trace_id not in self.runs}
        # A lease that ran out while the store was unreachable from here too is an
        # outage, not a crash: that claim is not an attempt.
        outage = self.outage.recently_down(self.settings.run_lease_seconds * 2)
        await self.take(list(owners), attempt=not outage, owners=owners)

    async def _lease_loop(self) -> None:
        """Renew the leases of the runs executing here, on the lease connection (never
        behind request traffic). Works on a snapshot taken before the renewal: a run
        launched meanwhile is not in it and is left alone. A run whose lease could not be
        renewed for most of its length is stopped here (no more provider or tool calls,
        nothing written): another process, or this one, claims it when the store lets it."""
        every = max(0.2, self.settings.run_lease_seconds / 3)
        while True:
            await asyncio.sleep(every)
            lives = {live.trace_id: live for live in self.runs.running()}
            if lives:
                await self._renew(lives)

    async def _renew(self, lives: dict[str, LiveRun]) -> None:
        try:
            await self._renew_and_check(lives)
        finally:  # before the loop's sleep, whatever happened
            await self.store.release()

    async def _renew_and_check(self, lives: dict[str, LiveRun]) -> None:
        lease = self.settings.run_lease_seconds
        loop = asyncio.get_running_loop()
        try:
            held = await self.store.renew({trace_id: live.claim for trace_id, live in lives.items()})
        except Exception as exc:  # noqa: BLE001 - the next tick tries again
            metrics.lease_renewals("failed")
            metrics.store_unavailable()
            if not self.outage.failed(exc, "renewing run leases"):
                logger.exception("renewing run leases failed")
            now = loop.time()
            for live in lives.values():
                if now - live.renewed_at > lease * 0.8:  # stop before the lease ends
                    live.writes.abandon()
                    self.runs.stop(live, StopReason.LOST)
            return
        self.outage.succeeded()
        metrics.store_available()
        metrics.lease_renewals("renewed", len(held))
        now = loop.time()
        for trace_id, live in lives.items():
            if trace_id not in held and live.ending:
                continue  # its end is being stored: no longer active in the store
            if trace_id not in held:  # another process took it: stop, write nothing
                self._lost(live)
                continue
            live.renewed_at = now
            if held[trace_id]:  # its cancel requested (with its tree's)
                live.tree_cancelled = True
                self.runs.stop(live, StopReason.CANCELLED, CANCELLED_BY_REQUEST)
            elif live.questions:
                try:
                    await self.questions.check_replies(live)
                except Exception as exc:  # noqa: BLE001 - the next tick tries again
                    self.outage.failed(exc, "reading replies")

    def _lost(self, live: LiveRun) -> None:
        """Another process holds the run now: stop it here, writing nothing more."""
        metrics.lease_renewals("lost")
        observe.run_outcome(live.trace_id, StopReason.LOST)
        logger.warning("run %s is held by another process now", live.trace_id)
        live.writes.abandon()
        self.runs.stop(live, StopReason.LOST)

    # -- signals ----------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """A background job kept referenced until it ends (and cancelled at stop)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def background(self) -> int:
        """How many background jobs (reply checks a signal started) are running."""
        return len(self._background)

    def on_control(self, payload: str) -> None:
        """A `control` signal: `wake:`, `cancel:<trace_id>[,<trace_id>…]` (the runs of a
        tree cancelled together) or `reply:<trace_id>`."""
        verb, _, trace_id = payload.partition(":")
        if verb == "wake":
            self.runs.wake()
        elif verb == "cancel":
            for one in trace_id.split(","):
                live = self.runs.get(one)
                if live is not None:
                    live.tree_cancelled = True
                    self.runs.stop(live, StopReason.CANCELLED, CANCELLED_BY_REQUEST)
        elif verb == "reply" and (live := self.runs.get(trace_id)) is not None:
            self._spawn(self.questions.check_replies(live))

    def on_resync(self) -> None:
        """Signals may have been missed: look for queued runs and stored answers again."""
        self.runs.wake()
        for live in self.runs:
            if live.questions:
                self._spawn(self.questions.check_replies(live))
