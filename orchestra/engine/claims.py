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
from orchestra.engine.live import LiveRun
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
        )
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
                metrics.store_available()
            except Exception:  # noqa: BLE001 - the store may be briefly away: try again
                metrics.store_unavailable()
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
            if self.room <= 0:
                break
            if trace_id in self.runs:
                continue
            run = await self.ownership.claim(trace_id)
            if run is not None:
                self._launch(run)

    async def _lease_loop(self) -> None:
        every = max(0.2, self.settings.run_lease_seconds / 3)
        while True:
            await asyncio.sleep(every)
            if not self.runs:
                continue
            try:
                held = await self.ownership.renew(list(self.runs))
                metrics.store_available()
                metrics.lease_renewals("renewed", len(held))
                for trace_id, live in list(self.runs.items()):
                    if trace_id not in held:  # another process took it: stop, write nothing
                        metrics.lease_renewals("lost")
                        observe.run_outcome(trace_id, "lost")
                        logger.warning("run %s is held by another process now", trace_id)
                        live.writes.abandon()
                        self._stop_local(live, "lost", "")
                    elif held[trace_id]:
                        self._stop_local(live, RunStatus.CANCELLED, "The run was cancelled by request.")
                    elif live.questions:
                        await self._check_replies(live)
            except Exception:  # noqa: BLE001 - the next tick tries again
                metrics.lease_renewals("failed")
                metrics.store_unavailable()
                logger.exception("renewing run leases failed")
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
