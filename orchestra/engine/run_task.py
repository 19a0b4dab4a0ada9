"""A run's task in this process: start or resume it, run its schedule, end it.

A claimed run that already has events is *resumed*: finished steps keep their stored
outputs and are never called again, steps that were in flight start again, open
questions stay open (an answer given meanwhile is used), and `run_resumed` is appended.
After `max_attempts` claims the run ends `interrupted`. A run ends one way (`_end` →
`_close`: its terminal event with its final rows, in one transaction) or is handed back
to the store (`_hand_back`) when the process stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from peewee import IntegrityError

from orchestra.db.models import RunStep, WorkflowRun, utcnow
from orchestra.db.outage import release_quietly, sleep_backoff
from orchestra.engine.language import policies
from orchestra.engine.language.expressions import ExpressionError
from orchestra.engine.live import HandBack, LimitReached, LiveRun, RunFailed, StepFailure, path_of
from orchestra.engine.log import Event, Fenced, RunGone
from orchestra.engine.memory import trim_soon
from orchestra.engine.questions import read_questions
from orchestra.engine.sizes import check_output
from orchestra.engine.spend import BudgetStop
from orchestra.engine.vocabulary import EventKind, RunStatus, StepStatus
from orchestra.money.amounts import usd_text
from orchestra.observability import runs as observe
from orchestra.observability.metrics import budget_exhausted as observe_budget_exhausted

logger = logging.getLogger("orchestra.engine")



class RunLifecycle:
    """Engine part: a run's task from claim to end or hand-back."""

    async def _run(self, live: LiveRun) -> None:
        trace_id, writes = live.trace_id, live.writes
        live.started = True
        try:
            if live.stop_asked:
                raise asyncio.CancelledError
            if await self._already_ended(live):
                return
            if live.attempt > self.settings.run_max_attempts:
                await self._end(
                    live, RunStatus.INTERRUPTED, EventKind.RUN_FAILED,
                    f"The run was interrupted {live.attempt - 1} times "
                    f"(ORCHESTRA_RUN_MAX_ATTEMPTS is {self.settings.run_max_attempts}).",
                )
                return
            restarted = await self._load_state(live)
            observe.run_began(trace_id, resumed=restarted is not None)
            if restarted is None:
                now = utcnow()
                live.started_epoch = time.time()
                writes.submit(self._set_run, trace_id, status=RunStatus.RUNNING, started_at=now)
                writes.submit(
                    self.log.append, trace_id, EventKind.RUN_STARTED,
                    {"status": RunStatus.RUNNING, "input": live.input, "steps": [s["id"] for s in live.steps]},
                )
                reused = [(EventKind.STEP_FINISHED, {"output": state["output"], "reused": True}, sid)
                          for sid, state in live.states.items()]
                if reused:  # steps copied from the run this one retries
                    writes.submit(self.log.append_many, trace_id, reused)
            else:
                writes.submit(self._set_run, trace_id, status=RunStatus.RUNNING)
                writes.submit(
                    self.log.append, trace_id, EventKind.RUN_RESUMED,
                    {"status": RunStatus.RUNNING, "attempt": live.attempt, "restarted_steps": restarted},
                )
            states = await self._schedule_within_deadline(live)
            try:
                final = await policies.run_output(live.spec, live.steps, states, live.input, self.sandbox)
                check_output(final, limit=self.settings.step_output_max_bytes, of="the template")
            except ExpressionError as exc:
                raise RunFailed("", f"The template's output failed: {exc.message}") from None
            except StepFailure as failure:
                raise RunFailed("", failure.message) from None
            writes.submit(self._close, trace_id, EventKind.RUN_FINISHED,
                          {"status": RunStatus.SUCCEEDED, "output": final}, status=RunStatus.SUCCEEDED)
            await writes.drain()
        except RunFailed as failure:
            await self._end(live, RunStatus.FAILED, EventKind.RUN_FAILED, failure.message, step_id=failure.step_id)
        except HandBack:
            await self._hand_back(live)
        except BudgetStop as stop:
            await self._budget_stop(live, stop)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if live.stop_status == "handback":
                await self._hand_back(live)
            elif live.stop_status != "lost":
                kind = EventKind.RUN_FAILED if live.stop_status == RunStatus.INTERRUPTED else EventKind.RUN_CANCELLED
                await self._end(live, live.stop_status, kind, live.stop_reason)
        except RunGone:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug or a failing store must still end the run
            if self.outage.failed(exc, f"run {trace_id}"):
                # The store went away under the run: write nothing, let the lease run
                # out; whoever reaches the store first resumes it (not as an attempt).
                live.writes.abandon()
                return
            logger.exception("run %s crashed", trace_id)
            await self._end(live, RunStatus.FAILED, EventKind.RUN_FAILED,
                            f"Internal error: {type(exc).__name__}: {exc}"[:500])
        finally:
            if live.mcp is not None:  # ended, failed, cancelled or handed back: close them
                await live.mcp.aclose()
            await writes.settle()
            for question in live.questions.values():
                if question.future is not None and not question.future.done():
                    question.future.cancel()
            self.runs.pop(trace_id, None)
            self.log.forget(trace_id)
            await self.log.release()
            trim_soon()  # a large run's freed memory goes back to the system
            if self._wake is not None and not self.stopping:
                self._wake.set()  # room for another run

    async def _budget_stop(self, live: LiveRun, stop: BudgetStop) -> None:
        """The budget cannot hold the next call: `on_budget: fail` ends the run after
        `budget_exceeded`; `pause` gives it up as `waiting_budget` (no owner, no task)
        after `budget_exhausted`, until a top-up queues it again (SPEC §12)."""
        observe_budget_exhausted()
        data = {"budget_usd": usd_text(stop.budget), "spent_usd": usd_text(stop.spent)}
        if (live.spec.get("limits") or {}).get("on_budget") != "pause":
            live.writes.submit(self.log.append, live.trace_id, EventKind.BUDGET_EXCEEDED, data)
            await self._end(live, RunStatus.FAILED, EventKind.RUN_FAILED,
                            f"The run's budget of ${data['budget_usd']} cannot pay for its next "
                            f"model call (${data['spent_usd']} spent or reserved).")
            return
        _past_stopping(live)
        await live.writes.settle()
        trace_id = live.trace_id

        async def store_pause() -> list[Event]:
            await self._store_spend(trace_id)
            await self._set_run(trace_id, status=RunStatus.WAITING_BUDGET,
                                owner_process=None, lease_until=None)
            return await self.log.insert(trace_id, [(EventKind.BUDGET_EXHAUSTED, {
                "status": RunStatus.WAITING_BUDGET, **data}, None)])

        try:
            await self._store_with_events(trace_id, store_pause)
        except RunGone:
            pass

    async def _already_ended(self, live: LiveRun) -> bool:
        """A run whose terminal event is stored but whose row was not updated (its owner
        died in between): bring the row in line, nothing else."""
        last = await self.log.last_event(live.trace_id)
        if last is None or not last.terminal:
            return False
        status = last.data.get("status") or {EventKind.RUN_FINISHED: RunStatus.SUCCEEDED,
                                              EventKind.RUN_CANCELLED: RunStatus.CANCELLED}.get(last.kind, RunStatus.FAILED)
        await self._set_run(live.trace_id, status=status, finished_at=utcnow(),
                            owner_process=None, lease_until=None)
        return True

    async def _schedule_within_deadline(self, live: LiveRun) -> dict[str, dict[str, Any]]:
        """The schedule, bounded by limits.deadline_seconds from run_started (waits included)."""
        seconds = (live.spec.get("limits") or {}).get("deadline_seconds")
        if not seconds:
            return await self._schedule(live)
        loop = asyncio.get_running_loop()
        left = (live.started_epoch or time.time()) + seconds - time.time()
        try:
            async with asyncio.timeout_at(loop.time() + max(0.0, left)):
                return await self._schedule(live)
        except TimeoutError:
            raise LimitReached("", f"The run passed its deadline of {seconds} s "
                                   "(limits.deadline_seconds).") from None

    async def _load_state(self, live: LiveRun) -> list[str] | None:
        """For a run that already has events (claimed again): ended steps' states, earlier
        questions, and the steps that start again. None for a fresh run, which only loads
        the steps a retried run reuses."""
        rows = await self.db.list(RunStep.select().where(RunStep.run == live.trace_id))
        if await self.log.max_seq(live.trace_id) == 0:
            for row in rows:
                if row.reused and row.status == StepStatus.SUCCEEDED:
                    live.finished.set(row.path or row.step_id, row.status, step_output(row))
                    if (row.path or row.step_id) == row.step_id:  # a top-level step
                        live.states[row.step_id] = {"output": step_output(row), "status": StepStatus.SUCCEEDED}
            return None
        live.earlier = await read_questions(self.db, live.trace_id)
        waiting_humans = {q.path for q in live.earlier if not q.answered}
        on_error = {s["id"]: s.get("on_error") for s in live.steps}
        restarted = []
        top = {s["id"]: s for s in live.steps}
        for row in rows:
            path = row.path or row.step_id
            live.finished.set(path, row.status, step_output(row))  # every instance (SPEC §8)
            live.executions += row.attempt if row.status != StepStatus.PENDING and not row.reused else 0
            if path not in top:
                continue
            if row.status == StepStatus.SUCCEEDED:
                live.states[row.step_id] = {"output": step_output(row), "status": StepStatus.SUCCEEDED}
            elif row.status == StepStatus.SKIPPED:
                live.states[row.step_id] = {"output": None, "status": StepStatus.SKIPPED}
            elif row.status == StepStatus.FAILED and on_error.get(row.step_id) == "continue":
                live.states[row.step_id] = {"output": None, "status": StepStatus.FAILED}
            elif row.status == StepStatus.FAILED:
                raise RunFailed(row.step_id, f"Step '{row.step_id}' failed: {row.error}")
            elif row.status in (StepStatus.RUNNING, StepStatus.WAITING_REPLY):
                live.step_attempts[path] = row.attempt or 1
                human = (top[path].get("agent") or {}).get("human")
                if not (human and path in waiting_humans):
                    restarted.append(row.step_id)
        order = [s["id"] for s in live.steps]
        return sorted(restarted, key=order.index)

    async def _end(
        self, live: LiveRun, status: str, kind: str, message: str, *, step_id: str | None = None
    ) -> None:
        """The one way a run ends unhappily: its terminal event with its final rows
        (`_close`). Retried with backoff while the store is unreachable, until this
        process loses the lease (then whoever claims the run next ends it); fenced on the
        claim, so a stale end is refused, never retried."""
        _past_stopping(live)
        trace_id = live.trace_id
        await live.writes.settle()
        tries = 0
        data: dict[str, Any] = {"status": status, ("error" if status == RunStatus.FAILED else "reason"): message}
        if step_id:
            data["failed_step"] = step_id
        while True:
            try:
                last = await self.log.last_event(trace_id)
                if last is None or not last.terminal:
                    await self._close(trace_id, kind, data, status=status, error=message)
                return
            except RunGone:  # gone, or Fenced: another process holds it now
                return
            except Exception as exc:  # noqa: BLE001 - the store may be away for a moment
                if not self.outage.failed(exc, f"ending run {trace_id}"):
                    logger.exception("could not record the end of run %s", trace_id)
                    return  # the lease runs out; whoever claims it next ends it
                if live.stop_status == "lost":  # the lease ran out meanwhile
                    return
                tries += 1
                await release_quietly(self.db)
                await sleep_backoff(tries)

    async def _close(self, trace_id: str, kind: str, data: dict[str, Any], *, status: str,
                     error: str | None = None) -> None:
        """Store a run's terminal event together with its final rows, in one transaction,
        and only then publish it: whoever sees the event reads the final state."""
        live = self.runs.get(trace_id)
        if live is not None:
            live.ending = True
        now = utcnow()
        step_status = StepStatus.CANCELLED if status == RunStatus.FAILED else status

        async def store_end() -> list[Event]:
            if status != RunStatus.SUCCEEDED:
                await self.db.aexecute(
                    RunStep.update(status=step_status, finished_at=now).where(
                        (RunStep.run == trace_id) & RunStep.status.in_([StepStatus.RUNNING, StepStatus.WAITING_REPLY])
                    )
                )
                await self.db.aexecute(
                    RunStep.update(status=StepStatus.SKIPPED).where(
                        (RunStep.run == trace_id) & (RunStep.status == StepStatus.PENDING)
                    )
                )
            await self._store_spend(trace_id)
            await self._set_run(trace_id, status=status, error=error, finished_at=now,
                                owner_process=None, lease_until=None)
            return await self.log.insert(trace_id, [(kind, data, None)])

        await self._store_with_events(trace_id, store_end)
        observe.run_ended(trace_id, status)

    async def _store_with_events(
        self, trace_id: str, store: Callable[[], Awaitable[list[Event]]], *, fenced: bool = True
    ) -> list[Event]:
        """Run `store()` — row changes and `log.insert` — in one write transaction, from
        the start again while another writer takes the same seq (a conflict aborts a
        PostgreSQL transaction, so only a whole retry works); publish after the commit."""
        while True:
            try:
                async with self.core.write_transaction():
                    if fenced:  # an owner's write: its claim still holds, or Fenced
                        await self._fence(trace_id)
                    events = await store()
                break
            except IntegrityError:  # a seq taken meanwhile, or the run deleted
                self.log.forget(trace_id)  # read the last seq from the store next time
                if await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id) is None:
                    raise RunGone(f"run {trace_id} no longer exists") from None
                await asyncio.sleep(0.005)
        self.log.remember(trace_id, events)
        self.log.published(trace_id, events)
        return events

    async def _hand_back(self, live: LiveRun) -> None:
        _past_stopping(live)
        await live.writes.settle()
        try:
            if not await self.ownership.hand_back(live.trace_id, live.claim):
                # Nothing to give back: ended meanwhile, handed back in bulk by `stop`, or
                # no longer held by this claim. Logged to tell the last case apart later.
                logger.info("run %s: hand-back found it not held by claim %s", live.trace_id, live.claim)
            observe.run_outcome(live.trace_id, "handback")
        except Exception:  # noqa: BLE001 - the lease runs out on its own
            logger.exception("could not hand back run %s", live.trace_id)

    def _stop_local(self, live: LiveRun, status: str, reason: str) -> None:
        """Stop a live run once: `cancelled`/`interrupted` end it, `handback` gives it back
        to the store, `lost` (another process holds it now) writes nothing more."""
        if live.task is None or live.task.done():
            return
        if live.stop_asked:
            if status == "lost":
                live.stop_status = "lost"
            return
        live.stop_asked, live.stop_status = True, status
        if reason:
            live.stop_reason = reason
        if live.started:
            live.task.cancel()

    # -- fencing: the owner's writes are conditioned on its claim ------------------------
    async def _fence(self, trace_id: str) -> None:
        """Inside a transaction, for a run executing here: lock its row while this
        process's claim (`LiveRun.claim`) holds it, else raise Fenced (nothing of the
        transaction is written, and the run's task stops). Other runs: nothing to check."""
        live = self.runs.get(trace_id)
        if live is None or not live.claim:
            return
        changed = await self.db.aexecute(
            WorkflowRun.update(owner_process=WorkflowRun.owner_process)
            .where(self.ownership.holds(trace_id, live.claim))
        )
        if not changed:
            raise Fenced(f"run {trace_id}: this process no longer holds its claim")

    async def _fenced(self, trace_id: str, query) -> None:
        """Execute an owner's row change in one transaction with the fence (or inside the
        caller's, which checked it already)."""
        if self.db.in_transaction() or trace_id not in self.runs:
            await self.db.aexecute(query)
            return
        async with self.core.write_transaction():
            await self._fence(trace_id)
            await self.db.aexecute(query)

    async def _set_run(self, trace_id: str, **values: Any) -> None:
        await self._fenced(trace_id, WorkflowRun.update(**values).where(WorkflowRun.trace_id == trace_id))

    async def _set_step(self, trace_id: str, path: str, **values: Any) -> None:
        """Update one instance's row (`path`: a top-level step's is its id)."""
        await self._fenced(trace_id, RunStep.update(**values).where(
            (RunStep.run == trace_id) & (RunStep.path == str(path_of(path)))))

    async def _put_instance(self, trace_id: str, path: str, step_id: str, **values: Any) -> None:
        """Create an instance's row, or update it when it exists (a top-level step's row
        is made with the run; an item's or an iteration's when it first starts)."""
        await self._fenced(trace_id, RunStep.insert(run=trace_id, path=path, step_id=str(step_id), **values)
                           .on_conflict(conflict_target=[RunStep.run, RunStep.path], update=values))

    def _fence_of(self, trace_id: str):
        """For the event log: the fence of an append to a run executing here, or None."""
        live = self.runs.get(trace_id)
        if live is None or not live.claim:
            return None
        return lambda: self._fence(trace_id)


def step_output(row: RunStep) -> Any:
    """A step row's output: its JSON value when it has one, else its text (None for a
    JSON null, a skipped or a failed step: the same value the run had before it was
    handed over, and the same the run detail shows)."""
    return row.output_value if row.output_value is not None else row.output


def _past_stopping(live: LiveRun) -> None:
    """The run is being ended or handed back: a stop (`_stop_local`) must leave its task
    alone now. Cancelled while its last writes settle, the end or hand-back would never
    be stored; the run would keep its owner until its lease ran out, and the next claim
    would count as a crash."""
    live.stop_asked = True
