"""Runs a template's steps as engine-owned asyncio tasks, writing the event log as it goes.

Runs are a queue in the store. `submit` claims a just-queued run for this process when
it has room (`max_runs`), otherwise wakes the others; a claim loop takes runs nobody
holds — queued ones, and those whose owner's lease ran out (the owner died) — and a
lease loop renews this process's leases and picks up cancels asked elsewhere. A
claimed run that already has events is *resumed*: finished steps keep their stored
outputs and are never called again, steps that were in flight start again, open
questions stay open (an answer given meanwhile is used), and `run_resumed` is
appended. After `max_attempts` claims the run ends `interrupted`.

An agent step is a streamed chat with its provider (tokens coalesced into `token`
events, tool calls run and fed back, at most `llm_max_tool_rounds` rounds, retryable
provider errors retried while nothing of the attempt has been shown). A human step, like
the `ask_user` tool, emits `reply_requested` and waits; an answer is stored by whichever
process received it (`reply`) and reaches the owner as a signal, or from the store on
the next lease tick. A run's own writes go through its `RunWriter`, in order.

The engine is given what it needs — an agent resolver, the tool registry, a file
reader, the signals — by the service that builds it; it imports nothing from services.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from peewee import IntegrityError

from orchestra.db.models import RunEvent, RunStep, WorkflowRun, utcnow
from orchestra.db.signals import Signals
from orchestra.engine.coalescer import TokenCoalescer
from orchestra.engine.feed import Feeds
from orchestra.engine.llm import (
    ChatMessage,
    ChatResult,
    LLMError,
    TextDelta,
    make_client,
    with_retries,
)
from orchestra.engine.log import Event, EventLog, RunGone
from orchestra.engine.memory import trim_soon
from orchestra.engine.ownership import ACTIVE, Ownership, process_identity
from orchestra.engine.tools import ToolContext, ToolError, ToolRegistry
from orchestra.engine.tools.mcp.sessions import RunSessions
from orchestra.engine.writer import RunWriter
from orchestra.errors import ConflictError, NotFoundError, OrchestraError

logger = logging.getLogger("orchestra.engine")

PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
FINISHED = ("succeeded", "failed", "cancelled", "interrupted")
END_RETRY_SECONDS = 60.0  # how long a run's end is retried while the store fails
CANCEL_WAIT_SECONDS = 5.0  # how long a cancel waits for another process's owner to end the run


class StepFailure(Exception):
    """A step failed for a reason the user should read (a provider's own message, …)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _RunFailed(Exception):
    def __init__(self, step_id: str, message: str) -> None:
        super().__init__(message)
        self.step_id = step_id
        self.message = message


class _HandBack(Exception):
    """The process is stopping and nothing of the run is in flight: give it up now."""


class AgentResolver(Protocol):
    """What the engine asks for an agent step's configuration (services' AgentCache)."""

    async def worker(self, worker_id: str) -> Any: ...

    async def node(self, name: str) -> Any: ...


@dataclass
class Question:
    """A `reply_requested` of a run, and its answer once one is stored."""

    request_id: str
    step_id: str
    prompt: str
    answer: str | None = None
    future: asyncio.Future | None = None


@dataclass
class LiveRun:
    """A run executing in this process."""

    trace_id: str
    owner_id: str
    input: str
    files: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    attempt: int = 1
    task: asyncio.Task | None = None
    questions: dict[str, Question] = field(default_factory=dict)  # waited on here, now
    earlier: list[Question] = field(default_factory=list)  # asked by an earlier attempt
    outputs: dict[str, str] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)  # steps waiting for a reply
    writes: RunWriter = field(default_factory=RunWriter)  # its store writes, in order
    wake: asyncio.Future | None = None
    started: bool = False  # its task has begun (a task cancelled before that never runs)
    stop_asked: bool = False
    stop_status: str = "cancelled"  # or "interrupted", "handback", "lost"
    stop_reason: str = "The run was cancelled."
    mcp: RunSessions | None = None  # its MCP sessions, opened at their first call

    def mcp_sessions(self, allowed: frozenset[str]) -> RunSessions:
        if self.mcp is None:
            self.mcp = RunSessions(allowed)
        return self.mcp

    def poke(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def take_earlier(self, step_id: str, prompt: str) -> Question | None:
        for question in self.earlier:
            if question.step_id == step_id and question.prompt == prompt:
                self.earlier.remove(question)
                return question
        return None


def render_prompt(template: str, *, input: str, outputs: dict[str, str]) -> str:
    """Fill `{{input}}` and `{{steps.<id>.output}}`; the template was validated before."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name == "input":
            return input
        if name.startswith("steps.") and name.endswith(".output"):
            return outputs.get(name[len("steps."):-len(".output")], "")
        return match.group(0)

    return PLACEHOLDER.sub(value, template)


async def read_questions(db: Any, trace_id: str) -> list[Question]:
    """Every question of a run, oldest first, with its answer where one is stored."""
    rows = await db.list(
        RunEvent.select(RunEvent.kind, RunEvent.data)
        .where((RunEvent.run == trace_id)
               & RunEvent.kind.in_(["reply_requested", "reply_received"]))
        .order_by(RunEvent.seq)
    )
    asked: dict[str, Question] = {}
    for row in rows:
        request_id = row.data.get("request_id")
        if row.kind == "reply_requested":
            asked[request_id] = Question(request_id, row.data.get("step_id"), row.data.get("prompt"))
        elif request_id in asked and asked[request_id].answer is None:
            asked[request_id].answer = str(row.data.get("content", ""))
    return list(asked.values())


class Engine:
    """Owns this process's run tasks, its claims and leases, and its live event feeds."""

    def __init__(
        self,
        core: Any,
        *,
        agents: AgentResolver,
        registry: ToolRegistry,
        read_upload: Callable[[str, str], Awaitable[str]],
        signals: Signals,
        exclusive: bool,
        token_interval: float = 0.05,
        retry_base_delay: float = 0.5,
    ) -> None:
        self.core = core
        self.db = core.db
        self.settings = core.settings
        self.agents = agents
        self.registry = registry
        self.read_upload = read_upload
        self.signals = signals
        self.exclusive = exclusive  # one process serves this store (SQLite)
        self.log = EventLog(core.db)
        self.feeds = Feeds(self.log, signals)
        self.ownership = Ownership(
            core.db, me=process_identity(), lease_seconds=self.settings.run_lease_seconds
        )
        self.token_interval = token_interval
        self.retry_base_delay = retry_base_delay
        self.runs: dict[str, LiveRun] = {}
        self._clients: dict[tuple, Any] = {}
        self._clients_lock = asyncio.Lock()
        self._loops: list[asyncio.Task] = []
        self._wake: asyncio.Event | None = None
        self._started: asyncio.Future | None = None
        self.stopping = False

    # -- lifecycle --------------------------------------------------------------------------
    def is_live(self, trace_id: str) -> bool:
        return trace_id in self.runs

    async def start(self) -> None:
        """Listen for signals and start claiming and renewing (once; later calls wait)."""
        if self._started is not None:
            return await asyncio.shield(self._started)
        self._started = asyncio.get_running_loop().create_future()
        try:
            self._wake = asyncio.Event()
            self.signals.on("control", self._control)
            self.signals.on_resync(self._resync)
            await self.signals.start()
            if self.exclusive:  # the last owner of any unfinished run is certainly gone
                await self.ownership.expire_all()
                await self.log.release()
            self._loops = [
                asyncio.get_running_loop().create_task(self._claim_loop(), name="run-claims"),
                asyncio.get_running_loop().create_task(self._lease_loop(), name="run-leases"),
            ]
            self._started.set_result(None)
        except BaseException as exc:
            self._started.set_exception(exc)
            raise

    @property
    def room(self) -> int:
        return 0 if self.stopping else self.settings.max_runs - len(self.runs)

    async def submit(self, trace_id: str) -> None:
        """A run was stored `queued`: take it here if there is room, else wake the others."""
        await self.start()
        if self.room > 0:
            run = await self.ownership.claim(trace_id)
            await self.log.release()
            if run is not None:
                self._launch(run)
                return
        await self.signals.notify("control", f"wake:{trace_id}")

    def _launch(self, run: WorkflowRun) -> LiveRun:
        live = LiveRun(
            run.trace_id, run.owner_id, run.input or "", list(run.files or []), run.steps,
            attempt=run.attempts,
        )
        if run.cancel_requested:
            live.stop_asked, live.stop_reason = True, "The run was cancelled by request."
        self.runs[run.trace_id] = live
        live.task = asyncio.get_running_loop().create_task(
            self._run(live), name=f"run-{run.trace_id}"
        )
        return live

    async def _claim_loop(self) -> None:
        every = max(0.2, min(self.settings.run_lease_seconds / 3, 5.0))
        while not self.stopping:
            try:
                await self._claim_some()
            except Exception:  # noqa: BLE001 - the store may be briefly away: try again
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
                for trace_id, live in list(self.runs.items()):
                    if trace_id not in held:  # another process took it: stop, write nothing
                        logger.warning("run %s is held by another process now", trace_id)
                        live.writes.abandon()
                        self._stop_local(live, "lost", "")
                    elif held[trace_id]:
                        self._stop_local(live, "cancelled", "The run was cancelled by request.")
                    elif live.questions:
                        await self._check_replies(live)
            except Exception:  # noqa: BLE001 - the next tick tries again
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
            self._stop_local(live, "cancelled", "The run was cancelled by request.")
        elif verb == "reply":
            asyncio.get_running_loop().create_task(self._check_replies(live))

    def _resync(self) -> None:
        """Signals may have been missed: look for queued runs and stored answers again."""
        if self._wake is not None:
            self._wake.set()
        for live in list(self.runs.values()):
            if live.questions:
                asyncio.get_running_loop().create_task(self._check_replies(live))

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop claiming; let in-flight steps finish for `grace` seconds; hand every run
        still here back to the store (its lease ends now) so another process goes on."""
        self.stopping = True
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        for live in self.runs.values():
            live.poke()
        tasks = [live.task for live in self.runs.values() if live.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        rest = [live for live in self.runs.values() if live.task is not None and not live.task.done()]
        for live in rest:
            self._stop_local(live, "handback", "")
        if rest:
            await asyncio.wait([live.task for live in rest], timeout=10)
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        if self._started is not None and self._started.done() and not self._started.exception():
            try:
                await self.signals.notify("control", "wake:")
            except Exception:  # noqa: BLE001 - others find the runs on their next scan
                pass
        for client in self._clients.values():
            try:
                await client.aclose()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._clients.clear()

    # -- requests from any process ------------------------------------------------------------
    async def open_questions(self, trace_id: str) -> list[dict[str, str]]:
        """`[{request_id, step_id, prompt}]` the run waits on, oldest first (from the store)."""
        return [
            {"request_id": q.request_id, "step_id": q.step_id, "prompt": q.prompt}
            for q in await read_questions(self.db, trace_id) if q.answer is None
        ]

    async def reply(self, trace_id: str, *, content: str, request_id: str | None) -> Question:
        """Store the answer to an open question of the run (the oldest unless `request_id`)
        and deliver it to the run's owner, here or in another process. Exactly one answer
        is stored per question, whichever processes receive replies at once."""
        chosen: Question | None = None

        async def store_answer() -> list[Event]:
            nonlocal chosen
            query = WorkflowRun.select().where(WorkflowRun.trace_id == trace_id)
            if not self.exclusive:
                query = query.for_update()  # replies to one run, one at a time
            rows = await self.db.list(query)
            if not rows:
                raise NotFoundError(f"No run has the trace_id '{trace_id}'.")
            if rows[0].status in FINISHED:
                raise ConflictError(f"The run is not waiting for a reply (status: {rows[0].status}).")
            open_ = [q for q in await read_questions(self.db, trace_id) if q.answer is None]
            if not open_:
                raise ConflictError(f"The run is not waiting for a reply (status: {rows[0].status}).")
            chosen = open_[0] if request_id is None else next(
                (q for q in open_ if q.request_id == request_id), None)
            if chosen is None:
                raise ConflictError(
                    f"The request '{request_id}' is not waiting for a reply (stale or unknown).",
                    detail={"pending": [q.request_id for q in open_]},
                )
            events = await self.log.insert(trace_id, [(
                "reply_received", {"request_id": chosen.request_id, "content": content},
                chosen.step_id,
            )])
            # Seen at once by any reader of the run; the owner writes the same.
            await self._set_step(trace_id, chosen.step_id, status="running")
            if len(open_) == 1:
                await self.db.aexecute(WorkflowRun.update(status="running").where(
                    (WorkflowRun.trace_id == trace_id) & (WorkflowRun.status == "waiting_reply")))
            return events

        await self._store_with_events(trace_id, store_answer)
        await self.log.release()
        chosen.answer = content
        live = self.runs.get(trace_id)
        if live is not None:
            self._answer(live, chosen.request_id, content)
        else:
            await self.signals.notify("control", f"reply:{trace_id}")
        return chosen

    async def cancel(self, trace_id: str, *, reason: str = "The run was cancelled by request.") -> None:
        """Cancel an unfinished run wherever it executes, and wait (a little) for its end."""
        await self.db.aexecute(
            WorkflowRun.update(cancel_requested=True).where(
                (WorkflowRun.trace_id == trace_id) & WorkflowRun.status.in_(list(ACTIVE))
            )
        )
        live = self.runs.get(trace_id)
        if live is None and not self.stopping:
            run = await self.ownership.claim(trace_id)  # nobody holds it: end it here
            if run is not None:
                live = self._launch(run)  # it sees cancel_requested and ends at once
        await self.log.release()
        if live is not None:
            self._stop_local(live, "cancelled", reason)
            await asyncio.wait({live.task}, timeout=CANCEL_WAIT_SECONDS * 2)
            return
        await self.signals.notify("control", f"cancel:{trace_id}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT_SECONDS
        while loop.time() < deadline:
            last = await self.log.last_event(trace_id)
            await self.log.release()
            if last is None or last.terminal:
                return
            await asyncio.sleep(0.05)

    async def cancel_owner(self, user_id: str, *, reason: str) -> None:
        """Stop every live run of a user (the user is being deleted), all at once."""
        lives = [r for r in self.runs.values() if r.owner_id == user_id and r.task is not None]
        await self.log.release()
        for live in lives:
            self._stop_local(live, "cancelled", reason)
        if lives:
            await asyncio.wait([live.task for live in lives], timeout=10)

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

    # -- replies reaching the owner -----------------------------------------------------------
    def _answer(self, live: LiveRun, request_id: str, content: str) -> None:
        question = live.questions.get(request_id)
        if question is not None and question.future is not None and not question.future.done():
            question.future.set_result(content)

    async def _check_replies(self, live: LiveRun) -> None:
        """Answers stored by other processes for the questions this run waits on."""
        if not live.questions:
            return
        try:
            for question in await read_questions(self.db, live.trace_id):
                if question.answer is not None:
                    self._answer(live, question.request_id, question.answer)
        finally:
            await self.log.release()

    # -- the run ----------------------------------------------------------------------------
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
                    live, "interrupted", "run_failed",
                    f"The run was interrupted {live.attempt - 1} times "
                    f"(ORCHESTRA_RUN_MAX_ATTEMPTS is {self.settings.run_max_attempts}).",
                )
                return
            restarted = await self._load_state(live)
            if restarted is None:
                writes.submit(self._set_run, trace_id, status="running", started_at=utcnow())
                writes.submit(
                    self.log.append, trace_id, "run_started",
                    {"status": "running", "input": live.input, "steps": [s["id"] for s in live.steps]},
                )
            else:
                writes.submit(self._set_run, trace_id, status="running")
                writes.submit(
                    self.log.append, trace_id, "run_resumed",
                    {"status": "running", "attempt": live.attempt, "restarted_steps": restarted},
                )
            outputs = await self._schedule(live)
            final = outputs.get(live.steps[-1]["id"]) if live.steps else None
            writes.submit(self._close, trace_id, "run_finished",
                          {"status": "succeeded", "output": final}, status="succeeded")
            await writes.drain()
        except _RunFailed as failure:
            await self._end(live, "failed", "run_failed", failure.message, step_id=failure.step_id)
        except _HandBack:
            await self._hand_back(live)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if live.stop_status == "handback":
                await self._hand_back(live)
            elif live.stop_status != "lost":
                kind = "run_failed" if live.stop_status == "interrupted" else "run_cancelled"
                await self._end(live, live.stop_status, kind, live.stop_reason)
        except RunGone:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug or a failing store must still end the run
            logger.exception("run %s crashed", trace_id)
            await self._end(live, "failed", "run_failed",
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

    async def _already_ended(self, live: LiveRun) -> bool:
        """A run whose terminal event is stored but whose row was not updated (its owner
        died in between): bring the row in line, nothing else."""
        last = await self.log.last_event(live.trace_id)
        if last is None or not last.terminal:
            return False
        status = last.data.get("status") or {"run_finished": "succeeded",
                                              "run_cancelled": "cancelled"}.get(last.kind, "failed")
        await self._set_run(live.trace_id, status=status, finished_at=utcnow(),
                            owner_process=None, lease_until=None)
        return True

    async def _load_state(self, live: LiveRun) -> list[str] | None:
        """For a run that already has events (claimed again): finished outputs, earlier
        questions, and the steps that start again. None for a fresh run."""
        if await self.log.max_seq(live.trace_id) == 0:
            return None
        rows = await self.db.list(RunStep.select().where(RunStep.run == live.trace_id))
        live.earlier = await read_questions(self.db, live.trace_id)
        waiting_humans = {q.step_id for q in live.earlier if q.answer is None}
        restarted = []
        for row in rows:
            if row.status == "succeeded":
                live.outputs[row.step_id] = row.output or ""
            elif row.status == "failed":
                raise _RunFailed(row.step_id, f"Step '{row.step_id}' failed: {row.error}")
            elif row.status in ("running", "waiting_reply"):
                human = any(s["id"] == row.step_id and s["agent"].get("human") for s in live.steps)
                if not (human and row.step_id in waiting_humans):
                    restarted.append(row.step_id)
        order = [s["id"] for s in live.steps]
        return sorted(restarted, key=order.index)

    async def _end(
        self, live: LiveRun, status: str, kind: str, message: str, *, step_id: str | None = None
    ) -> None:
        """The one way a run ends unhappily: its terminal event with its final rows
        (`_close`). Retried for a minute while the store fails; past that this process stops
        renewing the run's lease, and whoever claims it next goes on with it."""
        trace_id = live.trace_id
        await live.writes.settle()
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + END_RETRY_SECONDS, 0.2
        data: dict[str, Any] = {"status": status, ("error" if status == "failed" else "reason"): message}
        if step_id:
            data["failed_step"] = step_id
        while True:
            try:
                last = await self.log.last_event(trace_id)
                if last is None or not last.terminal:
                    await self._close(trace_id, kind, data, status=status, error=message)
                return
            except RunGone:
                return
            except Exception:  # noqa: BLE001 - the store may be away for a moment
                logger.exception("could not record the end of run %s; retrying", trace_id)
                await self.log.release()
                if loop.time() > deadline:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _close(self, trace_id: str, kind: str, data: dict[str, Any], *, status: str,
                     error: str | None = None) -> None:
        """Store a run's terminal event together with its final rows, in one transaction,
        and only then publish it: whoever sees the event reads the final state."""
        now = utcnow()
        step_status = "cancelled" if status == "failed" else status

        async def store_end() -> list[Event]:
            if status != "succeeded":
                await self.db.aexecute(
                    RunStep.update(status=step_status, finished_at=now).where(
                        (RunStep.run == trace_id) & RunStep.status.in_(["running", "waiting_reply"])
                    )
                )
                await self.db.aexecute(
                    RunStep.update(status="skipped").where(
                        (RunStep.run == trace_id) & (RunStep.status == "pending")
                    )
                )
            await self._set_run(trace_id, status=status, error=error, finished_at=now,
                                owner_process=None, lease_until=None)
            return await self.log.insert(trace_id, [(kind, data, None)])

        await self._store_with_events(trace_id, store_end)

    async def _store_with_events(
        self, trace_id: str, store: Callable[[], Awaitable[list[Event]]]
    ) -> list[Event]:
        """Run `store()` — row changes and `log.insert` — in one write transaction, from
        the start again while another writer takes the same seq (a conflict aborts a
        PostgreSQL transaction, so only a whole retry works); publish after the commit."""
        while True:
            try:
                async with self.core.write_transaction():
                    events = await store()
                break
            except IntegrityError:  # a seq taken meanwhile, or the run deleted
                if await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id) is None:
                    raise RunGone(f"run {trace_id} no longer exists") from None
                await asyncio.sleep(0.005)
        self.log.forget(trace_id)  # this process's cached seq is behind now
        self.log.published(trace_id, events)
        return events

    async def _hand_back(self, live: LiveRun) -> None:
        await live.writes.settle()
        try:
            await self.ownership.hand_back(live.trace_id)
        except Exception:  # noqa: BLE001 - the lease runs out on its own
            logger.exception("could not hand back run %s", live.trace_id)

    async def _schedule(self, live: LiveRun) -> dict[str, str]:
        """Start steps as their dependencies succeed; independent ones run concurrently.
        While the process stops, no step starts, and a run with nothing but questions in
        flight is handed back."""
        outputs = live.outputs
        started: set[str] = set(outputs)
        tasks: dict[asyncio.Task, str] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                live.writes.check()  # a failed write (the run was deleted, …) ends the run
                if not self.stopping:
                    for step in live.steps:
                        sid = step["id"]
                        if sid in started or not all(d in outputs for d in step.get("depends_on", [])):
                            continue
                        started.add(sid)
                        tasks[loop.create_task(self._step(live, step, outputs))] = sid
                if not tasks:
                    if self.stopping and len(outputs) < len(live.steps):
                        raise _HandBack()
                    return outputs
                if self.stopping and all(sid in live.waiting for sid in tasks.values()):
                    raise _HandBack()
                await self.log.release()
                live.wake = loop.create_future()
                done, _ = await asyncio.wait([*tasks, live.wake], return_when=asyncio.FIRST_COMPLETED)
                failure: _RunFailed | None = None
                for task in done:
                    if task is live.wake:
                        continue
                    sid = tasks.pop(task)
                    error = task.exception()
                    if error is None:
                        outputs[sid] = task.result()
                    elif isinstance(error, StepFailure):
                        failure = failure or _RunFailed(sid, f"Step '{sid}' failed: {error.message}")
                    else:
                        raise error
                if failure is not None:
                    raise failure
        finally:
            live.wake = None
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _step(self, live: LiveRun, step: dict[str, Any], outputs: dict[str, str]) -> str:
        trace_id, sid, writes = live.trace_id, step["id"], live.writes
        prompt = render_prompt(step["prompt"], input=live.input, outputs=outputs)
        earlier = live.take_earlier(sid, prompt) if step["agent"].get("human") else None
        if earlier is None:  # a human step re-waiting on its open question starts nothing
            writes.submit(self._set_step, trace_id, sid, status="running", started_at=utcnow())
            writes.submit(
                self.log.append, trace_id, "step_started", {"agent": step["agent"], "prompt": prompt},
                step_id=sid,
            )
        pending_text = ""
        try:
            if step["agent"].get("human"):
                output, usage = await self._ask(live, sid, prompt, earlier=earlier), None
            else:
                output, usage, pending_text = await self._agent_step(live, step, prompt)
        except StepFailure as failure:
            writes.submit(self._set_step, trace_id, sid, status="failed", error=failure.message,
                          finished_at=utcnow())
            writes.submit(
                self.log.append, trace_id, "step_failed", {"error": failure.message}, step_id=sid
            )
            raise
        writes.submit(
            self._set_step, trace_id, sid, status="succeeded", output=output, usage=usage,
            finished_at=utcnow(),
        )
        last_tokens = [("token", {"text": pending_text}, sid)] if pending_text else []
        finished = ("step_finished", {"output": output, "usage": usage}, sid)
        writes.submit(self.log.append_many, trace_id, last_tokens + [finished])
        return output

    # -- agent steps ------------------------------------------------------------------------
    async def _agent_step(
        self, live: LiveRun, step: dict[str, Any], prompt: str
    ) -> tuple[str, dict[str, int], str]:
        """(output, usage, the last token text, not yet appended: the caller stores it)."""
        agent = step["agent"]
        if "worker" in agent:
            config = await self.agents.worker(agent["worker"])
            if config is None:
                raise StepFailure(f"The worker '{agent['worker']}' no longer exists.")
        else:
            config = await self.agents.node(agent["node"])
            if config is None:
                raise StepFailure(f"The system node '{agent['node']}' does not exist.")
        if not config.provider_kind or not config.model:
            raise StepFailure(
                f"The {config.kind} '{config.name}' has no provider configured."
                + (" An administrator can set one with PUT /api/v1/agent/node/"
                   f"{config.name}." if config.kind == "node" else "")
            )
        registry = self.registry
        try:
            await registry.load()
            tools, catalog_names = registry.offer(config.tools)
            client = await self._client_for(config)
        except (ToolError, LLMError) as exc:
            raise StepFailure(exc.message) from None
        system = "\n\n".join(p for p in (config.system_prompt, config.skill_instructions) if p)
        user_text = prompt
        if live.files:
            listed = ", ".join(f"{f['file_id']} ({f.get('filename', '')})" for f in live.files)
            user_text += f"\n\nAttached files (read them with read_upload by file_id): {listed}"
        messages = ([ChatMessage("system", system)] if system else []) + [
            ChatMessage("user", user_text)
        ]
        ctx = ToolContext(
            user_id=live.owner_id,
            trace_id=live.trace_id,
            step_id=step["id"],
            read_upload=lambda file_id: self._read_upload(live.owner_id, file_id),
            ask_user=lambda question: self._ask(
                live, step["id"], question, earlier=live.take_earlier(step["id"], question)
            ),
            mcp=live.mcp_sessions(self.settings.mcp_stdio_allowed),
        )
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        rounds = self.settings.llm_max_tool_rounds
        for round_number in range(rounds + 1):
            result, pending_text = await self._turn(
                live, step["id"], client, config.model, messages, tools
            )
            if result.usage is not None:
                usage["prompt_tokens"] += result.usage.prompt_tokens
                usage["completion_tokens"] += result.usage.completion_tokens
            if not result.tool_calls:
                return result.text, usage, pending_text
            if round_number == rounds:
                raise StepFailure(f"The model still asked for tools after {rounds} tool rounds.")
            messages.append(ChatMessage("assistant", result.text or None, tool_calls=result.tool_calls))
            for call in result.tool_calls:
                name = catalog_names.get(call.name, call.name)
                content = await self._tool(live, step["id"], registry, call, ctx, name)
                messages.append(
                    ChatMessage("tool", content, tool_call_id=call.id, name=call.name)
                )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _tool(self, live: LiveRun, sid: str, registry, call, ctx: ToolContext, name: str) -> str:
        """Run one tool call (`name`: its catalog name; the model may have used an
        encoded one); a failing tool becomes an error result for the model."""
        live.writes.submit(
            self.log.append,
            live.trace_id,
            "tool_call",
            {"call_id": call.id, "name": name, "arguments": call.arguments},
            step_id=sid,
        )
        result: str | None = None
        error: str | None = None
        try:
            await self.log.release()  # no pooled connection held while a tool (an MCP server) works
            result = await registry.run(name, call.arguments, ctx)
        except ToolError as exc:
            error = exc.message
        except (asyncio.CancelledError, RunGone, StepFailure):
            raise
        except Exception as exc:  # noqa: BLE001 - a broken tool must not end the step
            logger.warning("tool %s raised %r", name, exc)
            error = f"The tool {name} failed: {type(exc).__name__}: {exc}"
        data: dict[str, Any] = {"call_id": call.id, "name": name, "result": result}
        if error is not None:
            data["error"] = error
        live.writes.submit(self.log.append, live.trace_id, "tool_result", data, step_id=sid)
        return result if error is None else f"Error: {error}"

    async def _turn(
        self, live: LiveRun, sid: str, client, model: str, messages, tools
    ) -> tuple[ChatResult, str]:
        """One streamed model turn, retried on retryable errors before any token is shown.

        Returns the result and, for a final answer (no tool calls), the last buffered
        token text, which the caller appends together with `step_finished`."""
        limit = self.settings.step_output_max_bytes

        async def emit(text: str) -> None:
            live.writes.submit(self.log.append, live.trace_id, "token", {"text": text}, step_id=sid)

        coalescer = TokenCoalescer(emit, interval=self.token_interval)

        async def attempt() -> ChatResult:
            await self.log.release()  # no pooled connection held while the model talks
            shown = 0
            result: ChatResult | None = None
            try:
                async for event in client.stream_chat(model=model, messages=messages, tools=tools):
                    if isinstance(event, TextDelta) and event.text:
                        shown += len(event.text)
                        if shown > limit:
                            raise StepFailure(
                                f"The step's output passed the limit of {limit} characters "
                                "(ORCHESTRA_STEP_OUTPUT_MAX_BYTES)."
                            )
                        coalescer.add(event.text)
                    elif isinstance(event, ChatResult):
                        result = event
            except LLMError as exc:
                if shown:  # the user has seen part of this answer: never repeat it
                    raise LLMError(exc.message, status=exc.status, retryable=False) from exc
                raise
            if result is None:
                raise LLMError("The provider's stream ended without a result.", retryable=not shown)
            return result

        try:
            result = await with_retries(
                attempt,
                attempts=max(1, self.settings.llm_retries + 1),
                base_delay=self.retry_base_delay,
            )
        except LLMError as exc:
            await coalescer.flush()
            raise StepFailure(exc.message) from None
        except StepFailure:
            await coalescer.flush()
            raise
        except BaseException:
            await coalescer.close()
            raise
        if result.tool_calls:
            await coalescer.flush()
            return result, ""
        return result, await coalescer.take()

    async def _client_for(self, config) -> Any:
        """One provider client per (kind, URL, key), reused across steps and runs; built in
        a thread the first time (importing a provider SDK takes ~1–4 s of CPU), holding no
        store connection meanwhile."""
        key = (config.provider_kind, config.provider_base_url, config.provider_api_key)
        client = self._clients.get(key)
        if client is None:
            await self.log.release()
            async with self._clients_lock:
                client = self._clients.get(key)
                if client is None:
                    client = await asyncio.to_thread(self._build_client, config)
                    self._clients[key] = client
        return client

    def _build_client(self, config) -> Any:
        return make_client(
            kind=config.provider_kind,
            api_key=config.provider_api_key,
            base_url=config.provider_base_url,
            timeout=self.settings.llm_timeout,
        )

    async def _read_upload(self, owner_id: str, file_id: str) -> str:
        try:
            return await self.read_upload(owner_id, file_id)
        except OrchestraError as exc:
            raise ToolError(exc.message) from None

    # -- human in the loop ------------------------------------------------------------------
    async def _ask(self, live: LiveRun, sid: str, prompt: str, *,
                   earlier: Question | None = None) -> str:
        """Emit `reply_requested`, move the run to `waiting_reply`, wait for the answer.
        A question an earlier attempt asked is not asked again: its stored answer is
        used, or the same request is waited on."""
        if earlier is not None and earlier.answer is not None:
            return earlier.answer
        question = earlier or Question(uuid.uuid4().hex, sid, prompt)
        question.future = asyncio.get_running_loop().create_future()
        live.questions[question.request_id] = question
        live.waiting.add(sid)
        writes = live.writes
        try:
            writes.submit(self._set_run, live.trace_id, status="waiting_reply")
            writes.submit(self._set_step, live.trace_id, sid, status="waiting_reply")
            if earlier is None:
                await asyncio.shield(writes.submit(
                    self.log.append, live.trace_id, "reply_requested",
                    {"request_id": question.request_id, "prompt": prompt}, step_id=sid,
                ))
            else:
                await self._check_replies(live)  # answered while nobody held the run
            await self.log.release()
            content = await asyncio.shield(question.future)
        finally:
            live.questions.pop(question.request_id, None)
            live.waiting.discard(sid)
        writes.submit(self._set_step, live.trace_id, sid, status="running")
        if not live.questions:
            writes.submit(self._set_run, live.trace_id, status="running")
        return content

    # -- store helpers ----------------------------------------------------------------------
    async def _set_run(self, trace_id: str, **values: Any) -> None:
        await self.db.aexecute(WorkflowRun.update(**values).where(WorkflowRun.trace_id == trace_id))

    async def _set_step(self, trace_id: str, step_id: str, **values: Any) -> None:
        await self.db.aexecute(
            RunStep.update(**values).where((RunStep.run == trace_id) & (RunStep.step_id == step_id))
        )
