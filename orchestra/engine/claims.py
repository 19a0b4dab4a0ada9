"""Claims and leases: which runs this process executes, and keeping them.

Runs are a queue in the store. A claim loop takes runs nobody holds — queued ones, and
those whose owner's lease ran out (the owner died) — while there is room (`max_runs`);
a lease loop renews this process's leases, drops runs another process holds now, and
picks up cancels and answers given elsewhere. Signals (`control`: wake, cancel, reply)
are hints that make both act sooner.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from orchestra.db.models import WorkflowRun
from orchestra.db.outage import release_quietly, sleep_backoff
from orchestra.engine.live import LiveRun
from orchestra.engine.log import RunGone
from orchestra.engine.vocabulary import RunStatus
from orchestra.observability import metrics
from orchestra.observability import runs as observe

logger = logging.getLogger("orchestra.engine")


class ClaimLoops:
    """Engine part: the claim loop, the lease loop and the `control` signal."""

    def _launch(self, run: WorkflowRun) -> LiveRun:
        spec = run.spec or {}
        live = LiveRun(
            run.trace_id, run.owner_id,
            run.input_value if "input_schema" in spec else (run.input or ""),
            list(run.files or []), run.steps, attempt=run.attempts, spec=spec,
            started_epoch=(run.started_at.replace(tzinfo=dt.timezone.utc).timestamp()
                           if run.started_at else None),
            claim=run.owner_process,
            budget_pusd=run.budget_pusd,
        )
        live.renewed_at = asyncio.get_running_loop().time()
        live.writes.retry = self._write_failed
        live.writes.release = self.log.release
        if run.cancel_requested:
            live.stop_asked, live.stop_reason = True, "The run was cancelled by request."
        self.runs[run.trace_id] = live
        live.task = asyncio.get_running_loop().create_task(
            observe.observed_run(run.trace_id, run.trace_parent, run.attempts, self._run(live)),
            name=f"run-{run.trace_id}",
        )
        return live

    async def _claim_loop(self) -> None:
        every = max(0.2, min(self.settings.run_lease_seconds / 3, 5.0))
        while not self.stopping:
            try:
                await self._claim_some()
                self.outage.succeeded()
                metrics.store_available()
            except Exception as exc:  # noqa: BLE001 - the store may be briefly away: try again
                metrics.store_unavailable()
                if not self.outage.failed(exc, "claiming runs"):
                    logger.exception("claiming runs failed")
            await self.log.release()
            try:
                async with asyncio.timeout(every):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def _claim_some(self) -> None:
        for trace_id in await self.ownership.candidates(self.room):
            if self.room <= 0 or self.stopping:
                break
            if trace_id in self.runs:
                continue
            # A lease that ran out while the store was unreachable from here too is an
            # outage, not a crash: that claim is not an attempt.
            outage = self.outage.recently_down(self.settings.run_lease_seconds * 2)
            run = await self._claim_to_run(trace_id, attempt=not outage)
            if run is not None:
                self._launch(run)

    async def _claim_to_run(self, trace_id: str, *, attempt: bool = True):
        """Claim a run to execute here: its row, or None when another process holds it
        or this one began stopping while the claim was in flight. A run launched then
        could miss the hand-back and be left to its lease, and its next claim would count
        as an attempt: it is given back at once instead."""
        run = await self.ownership.claim(trace_id, attempt=attempt)
        if run is not None and self.stopping:
            await self.ownership.hand_back(trace_id, run.owner_process)
            return None
        return run

    async def _write_failed(self, exc: BaseException, tries: int) -> bool:
        """A run's write failed: while the store is unreachable, wait (capped backoff
        with jitter) and try again — the run keeps what it has; anything else fails it."""
        if isinstance(exc, RunGone) or not self.outage.failed(exc, "writing a run's events"):
            return False
        await release_quietly(self.db)
        await sleep_backoff(tries)
        return True

    async def _lease_loop(self) -> None:
        """Renew the leases of the runs executing here, on the lease connection (never
        behind request traffic). Works on a snapshot taken before the renewal: a run
        launched meanwhile is not in it and is left alone. A run whose lease could not be
        renewed for most of its length is stopped here (no more provider or tool calls,
        nothing written): another process, or this one, claims it when the store lets it."""
        lease = self.settings.run_lease_seconds
        every = max(0.2, lease / 3)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            lives = {trace_id: live for trace_id, live in self.runs.items()
                     if live.task is not None and not live.task.done()}
            if not lives:
                continue
            try:
                held = await self.ownership.renew(
                    {trace_id: live.claim for trace_id, live in lives.items()}, db=self.lease_db)
            except Exception as exc:  # noqa: BLE001 - the next tick tries again
                metrics.lease_renewals("failed")
                metrics.store_unavailable()
                if not self.outage.failed(exc, "renewing run leases"):
                    logger.exception("renewing run leases failed")
                now = loop.time()
                for live in lives.values():
                    if now - live.renewed_at > lease * 0.8:  # stop before the lease ends
                        live.writes.abandon()
                        self._stop_local(live, "lost", "")
                continue
            self.outage.succeeded()
            metrics.store_available()
            metrics.lease_renewals("renewed", len(held))
            now = loop.time()
            for trace_id, live in lives.items():
                if trace_id not in held and live.ending:
                    continue  # its end is being stored: no longer active in the store
                if trace_id not in held:  # another process took it: stop, write nothing
                    metrics.lease_renewals("lost")
                    observe.run_outcome(trace_id, "lost")
                    logger.warning("run %s is held by another process now", trace_id)
                    live.writes.abandon()
                    self._stop_local(live, "lost", "")
                    continue
                live.renewed_at = now
                if held[trace_id]:
                    self._stop_local(live, RunStatus.CANCELLED, "The run was cancelled by request.")
                elif live.questions:
                    try:
                        await self._check_replies(live)
                    except Exception as exc:  # noqa: BLE001 - the next tick tries again
                        self.outage.failed(exc, "reading replies")
            await self.log.release()

    def _control(self, payload: str) -> None:
        verb, _, trace_id = payload.partition(":")
        if verb == "wake":
            if self._wake is not None:
                self._wake.set()
            return
        live = self.runs.get(trace_id)
        if live is None:
            return
        if verb == "cancel":
            self._stop_local(live, RunStatus.CANCELLED, "The run was cancelled by request.")
        elif verb == "reply":
            asyncio.get_running_loop().create_task(self._check_replies(live))

    def _resync(self) -> None:
        """Signals may have been missed: look for queued runs and stored answers again."""
        if self._wake is not None:
            self._wake.set()
        for live in list(self.runs.values()):
            if live.questions:
                asyncio.get_running_loop().create_task(self._check_replies(live))
