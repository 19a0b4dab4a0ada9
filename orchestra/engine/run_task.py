"""A run's task in this process: start or resume it, run its schedule, end it.

A claimed run that already has events is *resumed*: finished steps keep their stored
outputs and are never called again, steps that were in flight start again, open
questions stay open (an answer given meanwhile is used), and `run_resumed` is appended.
After `max_attempts` claims the run ends `interrupted`. A run ends one way (`end` →
`RunStore.end`: its terminal event with its final rows, in one transaction) or is handed
back to the store (`_hand_back`) when the process stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from orchestra.db.models import RunStep, utcnow
from orchestra.db.outage import StoreOutage, sleep_backoff
from orchestra.engine.live import (
    HandBack,
    LimitReached,
    LiveRun,
    LiveRuns,
    RunFailed,
    StepFailure,
)
from orchestra.engine.memory import trim_soon
from orchestra.engine.model import StepDef, StopReason
from orchestra.engine.reuse import reused_events
from orchestra.engine.scheduler import Scheduler
from orchestra.engine.sizes import check_output
from orchestra.engine.spend import BudgetStop, Spending
from orchestra.engine.store import RunStore
from orchestra.engine.store.events import RunGone
from orchestra.language import policies, schemas
from orchestra.language.expressions import ExpressionError
from orchestra.language.sandbox import Sandbox
from orchestra.observability import runs as observe
from orchestra.observability.metrics import budget_exhausted
from orchestra.settings import Settings
from orchestra.vocabulary import EventKind, RunStatus, StepStatus

logger = logging.getLogger("orchestra.engine")


def step_output(row: RunStep) -> Any:
    """A step row's output: its JSON value when it has one, else its text (None for a
    JSON null, a skipped or a failed step: the same value the run had before it was
    handed over, and the same the run detail shows)."""
    return row.output_value if row.output_value is not None else row.output


def started_data(live: LiveRun) -> dict[str, Any]:
    """The data of a fresh run's `run_started`."""
    return {"status": RunStatus.RUNNING, "input": live.input, "steps": [s.id for s in live.steps]}


class RunTasks:
    """A run's task, from its claim to its end or hand-back."""

    def __init__(self, settings: Settings, *, store: RunStore, runs: LiveRuns,
                 scheduler: Scheduler, sandbox: Sandbox, outage: StoreOutage,
                 on_unhappy_end: Callable[[str, str], None] | None = None) -> None:
        self.settings = settings
        self.on_unhappy_end = on_unhappy_end  # a run ended other than succeeded: its children go too
        self.store = store
        self.runs = runs
        self.scheduler = scheduler
        self.sandbox = sandbox
        self.outage = outage

    async def run(self, live: LiveRun) -> None:
        """The run's task: to its end, a hand-back, or a stop that writes nothing."""
        live.started = True
        try:
            if live.stop_asked:
                raise asyncio.CancelledError
            if live.begun:  # run_started stored with its burst's (begin_many)
                observe.run_began(live.trace_id, resumed=False)
            elif not await self._start_or_resume(live):
                return
            states = await self._schedule_within_deadline(live)
            final = await self._output(live, states)
            live.writes.submit(self._succeed, live, final)
            await live.writes.drain()
        except RunFailed as failure:
            await self.end(live, RunStatus.FAILED, EventKind.RUN_FAILED, failure.message, step_id=failure.step_id)
        except (HandBack, BudgetStop) as stop:  # given up here: to the store, or for budget
            await (self._budget_stop(live, stop) if isinstance(stop, BudgetStop) else self._hand_back(live))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._stopped(live)
        except RunGone:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug or a failing store must still end the run
            if self.outage.failed(exc, f"run {live.trace_id}"):
                # The store went away under the run: write nothing, let the lease run
                # out; whoever reaches the store first resumes it (not as an attempt).
                live.writes.abandon()
                return
            logger.exception("run %s crashed", live.trace_id)
            await self.end(live, RunStatus.FAILED, EventKind.RUN_FAILED,
                           f"Internal error: {type(exc).__name__}: {exc}"[:500])
        finally:
            await self._cleanup(live)

    async def _start_or_resume(self, live: LiveRun) -> bool:
        """Before the schedule: False when the run ended here (its end was stored before,
        or its attempts are spent)."""
        if not live.fresh and await self._already_ended(live):
            return False
        if live.attempt > self.settings.run_max_attempts:
            await self.end(
                live, RunStatus.INTERRUPTED, EventKind.RUN_FAILED,
                f"The run was interrupted {live.attempt - 1} times "
                f"(ORCHESTRA_RUN_MAX_ATTEMPTS is {self.settings.run_max_attempts}).",
            )
            return False
        if live.unreadable:
            raise RunFailed("", live.unreadable)
        await self._begin(live)
        return True

    async def begin_many(self, lives: list[LiveRun]) -> None:
        """`run_started` for the fresh runs among `lives` (claimed together, tasks not
        yet started), in one transaction (`RunStore.start_many`); each is marked `begun`
        and its task goes straight to its schedule. The others, and all of them when the
        store refuses, begin in their own task as usual (`_begin`): it never raises."""
        fresh = {live.trace_id: live for live in lives
                 if not (live.stop_asked or live.unreadable or live.attempt != 1)}
        if not fresh:
            return
        try:
            started = await self.store.start_many({t: started_data(live) for t, live in fresh.items()})
        except Exception as exc:  # noqa: BLE001 - each task begins on its own instead
            if not self.outage.failed(exc, "starting runs"):
                logger.warning("starting %d runs together failed (%s): each starts on its own",
                               len(fresh), exc)
            return
        now = time.time()
        for trace_id in started:
            fresh[trace_id].begun, fresh[trace_id].started_epoch = True, now

    async def _stopped(self, live: LiveRun) -> None:
        """The task was stopped from outside (`LiveRuns.stop`): act on the reason."""
        if live.stop_reason == StopReason.HANDBACK:
            await self._hand_back(live)
        elif live.stop_reason == StopReason.INTERRUPTED:
            await self.end(live, RunStatus.INTERRUPTED, EventKind.RUN_FAILED, live.stop_message)
        elif live.stop_reason == StopReason.CANCELLED:
            await self.end(live, RunStatus.CANCELLED, EventKind.RUN_CANCELLED, live.stop_message)
        # StopReason.LOST: another process holds the run now; nothing is written

    async def _cleanup(self, live: LiveRun) -> None:
        if live.mcp is not None:  # ended, failed, cancelled or handed back: close them
            await live.mcp.aclose()
        await live.writes.settle()
        for question in live.questions.values():
            if question.future is not None and not question.future.done():
                question.future.cancel()
        self.store.let_go(live.trace_id)
        self.runs.remove(live.trace_id)  # room for another run
        await self.store.release()
        trim_soon()  # a large run's freed memory goes back to the system

    async def _begin(self, live: LiveRun) -> None:
        """`run_started` for a fresh run (and the steps a retry reuses), `run_resumed`
        for one claimed again."""
        trace_id, writes = live.trace_id, live.writes
        if live.fresh:  # nothing stored but its queued rows: the first event's seq is 1
            self.store.events.remember_none(trace_id)
            restarted = None
        else:
            restarted = await self._load_state(live)
        observe.run_began(trace_id, resumed=restarted is not None)
        live.resumed = restarted is not None
        if restarted is None:
            live.started_epoch = time.time()
            # with the steps copied from the run this one retries or forks
            writes.submit(self.store.store_run, trace_id, {"status": RunStatus.RUNNING, "started_at": utcnow()},
                          [(EventKind.RUN_STARTED, started_data(live), None), *reused_events(live)])
        else:
            resumed = {"status": RunStatus.RUNNING, "attempt": live.attempt, "restarted_steps": restarted}
            if live.paused_for_budget:  # a top-up let it go on: not a take-over (SPEC §15b)
                resumed["reason"] = "budget"
            writes.submit(self.store.store_run, trace_id, {"status": RunStatus.RUNNING},
                          [(EventKind.RUN_RESUMED, resumed, None)])

    async def _output(self, live: LiveRun, states: dict[str, dict[str, Any]]) -> Any:
        """The template's output, bounded as a step's is; RunFailed when it fails."""
        try:
            final = await policies.template_output(
                live.options.output, live.steps[-1].id if live.steps else None, states,
                live.input, self.sandbox)
            check_output(final, limit=self.settings.step_output_max_bytes, of="the template")
            if live.options.output_schema is not None:
                found = await schemas.check(final, live.options.output_schema, root="output",
                                            sandbox=self.sandbox)
                if found:
                    raise RunFailed("", "The run's output does not match the template's "
                                        f"output_schema: {schemas.describe(found)}")
        except ExpressionError as exc:
            raise RunFailed("", f"The template's output failed: {exc.message}") from None
        except StepFailure as failure:
            raise RunFailed("", failure.message) from None
        return final

    async def _succeed(self, live: LiveRun, final: Any) -> None:
        live.ending = True
        await self.store.end(live.trace_id, EventKind.RUN_FINISHED,
                             {"status": RunStatus.SUCCEEDED, "output": final}, status=RunStatus.SUCCEEDED)
        observe.run_ended(live.trace_id, RunStatus.SUCCEEDED)

    async def _already_ended(self, live: LiveRun) -> bool:
        """A run whose terminal event is stored but whose row was not updated (its owner
        died in between): bring the row in line, nothing else."""
        last = await self.store.last_event(live.trace_id)
        live.paused_for_budget = last is not None and last.kind == EventKind.BUDGET_EXHAUSTED
        if last is None or not last.terminal:
            return False
        status = last.data.get("status") or {EventKind.RUN_FINISHED: RunStatus.SUCCEEDED,
                                              EventKind.RUN_CANCELLED: RunStatus.CANCELLED}.get(last.kind, RunStatus.FAILED)
        await self.store.settle_ended(live.trace_id, status)
        return True

    async def _schedule_within_deadline(self, live: LiveRun) -> dict[str, dict[str, Any]]:
        """The schedule, bounded by limits.deadline_seconds from run_started (waits included)."""
        seconds = live.options.deadline_seconds
        if not seconds:
            return await self.scheduler.schedule(live)
        loop = asyncio.get_running_loop()
        left = (live.started_epoch or time.time()) + seconds - time.time()
        try:
            async with asyncio.timeout_at(loop.time() + max(0.0, left)):
                return await self.scheduler.schedule(live)
        except TimeoutError:
            raise LimitReached("", f"The run passed its deadline of {seconds} s "
                                   "(limits.deadline_seconds).") from None

    async def _load_state(self, live: LiveRun) -> list[str] | None:
        """For a run that already has events (claimed again): ended steps' states, earlier
        questions, and the steps that start again. None for a fresh run, which only loads
        the steps a retried run reuses."""
        rows = await self.store.step_rows(live.trace_id)
        if await self.store.max_seq(live.trace_id) == 0:
            for row in rows:
                if row.reused and row.status == StepStatus.SUCCEEDED:
                    live.finished.set(row.path or row.step_id, row.status, step_output(row))
                    if (row.path or row.step_id) == row.step_id:  # a top-level step
                        live.states[row.step_id] = {"output": step_output(row), "status": StepStatus.SUCCEEDED}
            return None
        live.earlier = await self.store.questions(live.trace_id)
        waiting_humans = {q.path for q in live.earlier if not q.answered}
        top: dict[str, StepDef] = {s.id: s for s in live.steps}
        restarted = []
        for row in rows:
            path = row.path or row.step_id
            live.finished.set(path, row.status, step_output(row))  # every instance (SPEC §8)
            if row.status in (StepStatus.PENDING, StepStatus.RUNNING, StepStatus.WAITING_REPLY):
                Spending.resumed(live, path, row)  # paused with a cost so far: it adds to it
            live.executions += row.attempt if row.status != StepStatus.PENDING and not row.reused else 0
            step = top.get(path)
            if step is None:
                continue
            if row.status in (StepStatus.SUCCEEDED, StepStatus.SKIPPED) or (
                    row.status == StepStatus.FAILED and step.continue_on_error):
                output = step_output(row) if row.status == StepStatus.SUCCEEDED else None
                live.states[row.step_id] = {"output": output, "status": row.status}
            elif row.status == StepStatus.FAILED:
                raise RunFailed(row.step_id, f"Step '{row.step_id}' failed: {row.error}")
            elif row.status in (StepStatus.RUNNING, StepStatus.WAITING_REPLY):
                live.step_attempts[path] = row.attempt or 1
                if not (step.human and path in waiting_humans):
                    restarted.append(row.step_id)
        order = [s.id for s in live.steps]
        return sorted(restarted, key=order.index)

    async def end(self, live: LiveRun, status: str, kind: str, message: str, *,
                  step_id: str | None = None) -> None:
        """The one way a run ends unhappily: its terminal event with its final rows
        (`RunStore.end`). Retried with backoff while the store is unreachable, until this
        process loses the lease (then whoever claims the run next ends it); fenced on the
        claim, so a stale end is refused, never retried."""
        live.past_stopping()
        trace_id = live.trace_id
        await live.writes.settle()
        tries = 0
        data: dict[str, Any] = {"status": status, ("error" if status == RunStatus.FAILED else "reason"): message}
        if step_id:
            data["failed_step"] = step_id
        while True:
            try:
                last = await self.store.last_event(trace_id)
                if last is None or not last.terminal:
                    live.ending = True
                    await self.store.end(trace_id, kind, data, status=status, error=message,
                                         spends=Spending.unfinished(live))
                    observe.run_ended(trace_id, status)
                    if self.on_unhappy_end is not None and live.starts_children:
                        self.on_unhappy_end(trace_id, f"Its parent run {trace_id} ended ({status}).")
                return
            except RunGone:  # gone, or Fenced: another process holds it now
                return
            except Exception as exc:  # noqa: BLE001 - the store may be away for a moment
                if not self.outage.failed(exc, f"ending run {trace_id}"):
                    logger.exception("could not record the end of run %s", trace_id)
                    return  # the lease runs out; whoever claims it next ends it
                if live.stop_reason == StopReason.LOST:  # the lease ran out meanwhile
                    return
                tries += 1
                await self.store.release()
                await sleep_backoff(tries)

    async def _budget_stop(self, live: LiveRun, stop: BudgetStop) -> None:
        """The budget cannot pay for the next call: `on_budget: fail` ends the run after
        `budget_exceeded`; `pause` gives it up as `waiting_budget` (no owner, no task)
        after `budget_exhausted`, until a top-up queues it again (SPEC §12)."""
        budget_exhausted()
        data = stop.data()
        whose = stop.whose(live.trace_id)
        if stop.on_budget != "pause":
            live.writes.submit(self.store.append, live.trace_id, EventKind.BUDGET_EXCEEDED, data)
            await self.end(live, RunStatus.FAILED, EventKind.RUN_FAILED, stop.message(whose))
            return
        live.past_stopping()
        await live.writes.settle()
        with contextlib.suppress(RunGone):  # another process holds it now
            await self.store.pause_for_budget(live.trace_id, {"status": RunStatus.WAITING_BUDGET, **data},
                                              spends=Spending.unfinished(live))

    async def _hand_back(self, live: LiveRun) -> None:
        live.past_stopping()
        await live.writes.settle()
        try:
            if not await self.store.hand_back(live.trace_id, live.claim):
                # Nothing to give back: ended meanwhile, handed back in bulk by `stop`, or
                # no longer held by this claim. Logged to tell the last case apart later.
                logger.info("run %s: hand-back found it not held by claim %s", live.trace_id, live.claim)
            observe.run_outcome(live.trace_id, StopReason.HANDBACK)
        except Exception:  # noqa: BLE001 - the lease runs out on its own
            logger.exception("could not hand back run %s", live.trace_id)
