"""The runs executing in this process: each `LiveRun`, the `LiveRuns` that hold them (and
whether this process is stopping), and the exceptions that end a run's task."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestra.egress import EgressPolicy
from orchestra.engine.instances import Finished
from orchestra.engine.model import At, Question, RunOptions, StepDef, StopReason
from orchestra.engine.tools.mcp.sessions import RunSessions
from orchestra.engine.writer import RunWriter

CANCELLED_BY_REQUEST = "The run was cancelled by request."


class StepFailure(Exception):
    """A step failed for a reason the user should read (a provider's own message, …)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RunFailed(Exception):
    def __init__(self, step_id: str, message: str) -> None:
        super().__init__(message)
        self.step_id = step_id
        self.message = message


class LimitReached(RunFailed):
    """A template limit (deadline, max_steps) ends the run."""


class HandBack(Exception):
    """The process is stopping and nothing of the run is in flight: give it up now."""


@dataclass
class LiveRun:
    """A run executing in this process."""

    trace_id: str
    owner_id: str
    input: Any  # text, or a JSON value under the template's input_schema
    files: list[dict[str, Any]]
    steps: tuple[StepDef, ...]
    attempt: int = 1
    options: RunOptions = field(default_factory=RunOptions)
    started_epoch: float | None = None  # when run_started was stored (limits.deadline_seconds)
    claim: str = ""  # the claim's token (`owner_process`): every write of ours is fenced on it
    ending: bool = False  # its terminal event is being stored
    renewed_at: float = 0.0  # loop time of the last lease renewal (or the claim)
    task: asyncio.Task | None = None
    questions: dict[str, Question] = field(default_factory=dict)  # waited on here, now
    earlier: list[Question] = field(default_factory=list)  # asked by an earlier attempt
    # Steps that have ended: {id: {output, status}} — what expressions see as `steps`.
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    step_attempts: dict[str, int] = field(default_factory=dict)  # attempt now running, per instance path
    item_labels: dict[str, str] = field(default_factory=dict)  # a foreach item's label, by path (its step_started's `item`)
    executions: int = 0  # step executions so far (limits.max_steps): attempts included
    finished: Finished = field(default_factory=Finished)  # stored instances, by path (SPEC §8)
    waiting: set[str] = field(default_factory=set)  # instance paths waiting for a reply
    writes: RunWriter = field(default_factory=RunWriter)  # its store writes, in order
    wakes: set[asyncio.Future] = field(default_factory=set)  # schedulers waiting, one per level
    started: bool = False  # its task has begun (a task cancelled before that never runs)
    begun: bool = False  # its run_started was stored with its burst's (RunTasks.begin_many)
    stop_asked: bool = False
    stop_reason: StopReason = StopReason.CANCELLED
    stop_message: str = "The run was cancelled."
    mcp: RunSessions | None = None  # its MCP sessions, opened at their first call
    # Run slots (SPEC §15b): call steps in flight, and how many of them wait — for a
    # reply, a child run (SPEC §14) or a retry delay. A run whose every call waits holds
    # no slot (`holds_slot`).
    calls: int = 0
    waits: int = 0
    # Stored by this process a moment ago, claimed in that same write (a child run,
    # `Engine.adopt`): no events, no ended steps, so nothing to read back before it begins.
    fresh: bool = False
    # Events an instance's next write carries (a workflow step's `child_finished`, stored
    # in one transaction with the step's end), by instance path.
    carried: dict[str, list] = field(default_factory=dict)
    resumed: bool = False  # claimed again: it had events (run_resumed)
    # Code steps (SPEC §17): each instance's clock, its stored start; read from the rows
    # once when a resumed run's first code step needs one.
    code_clocks: dict[str, Any] = field(default_factory=dict)
    code_clocks_read: bool = False
    unreadable: str | None = None  # why its stored steps could not be read (it fails)
    forked_from: dict[str, Any] | None = None  # a fork's source: {trace_id, from_step, outputs, again}
    fork_source: asyncio.Future | None = None  # the source's calls by reuse key, once read (reuse.py)
    trace_parent: str | None = None  # the W3C traceparent its run was started under
    # Spend (engine/spend.py): the budget in pico-dollars (None: none), each running
    # instance's calls and cost so far, and the calls in flight holding a reservation.
    budget_pusd: int | None = None
    parent_trace_id: str | None = None  # a child run's parent (SPEC §14): its costs roll up
    workspace_id: str | None = None  # its workspace (SPEC §16): a monthly budget caps its calls too
    ancestors: list[Any] | None = None  # the runs above it (store/ledger.Ancestor), read at its first call
    spends: dict[str, Any] = field(default_factory=dict)
    reserved_calls: int = 0
    # One reservation decision of the run at a time (engine/spend.py), and the budget
    # stop once decided: a call that has not reserved yet reserves nothing after it.
    reserving: asyncio.Lock = field(default_factory=asyncio.Lock)
    budget_stop: Any = None
    paused_for_budget: bool = False  # claimed again after a top-up (its last event: budget_exhausted)
    # Its cancel was requested in the store, where every cancel marks the run's whole tree
    # of child runs at once (RunStore.request_cancel): its waiting steps need not cancel
    # their children again; its end looks once for any child started since.
    tree_cancelled: bool = False

    @property
    def starts_children(self) -> bool:
        """A step of its template, at any depth, is a workflow step (SPEC §14)."""
        return _starts_children(self.steps)

    def mcp_sessions(self, allowed: frozenset[str], egress: EgressPolicy) -> RunSessions:
        """The run's MCP sessions (none is opened until a tool of a server is called)."""
        if self.mcp is None:
            self.mcp = RunSessions(allowed, egress)
        return self.mcp

    @property
    def holds_slot(self) -> bool:
        """It counts against ORCHESTRA_MAX_RUNS (and _PER_USER): unless each of its calls
        in flight waits (a run between steps, starting or ending holds its slot)."""
        return not (self.waits and self.waits >= self.calls)

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """A call step in flight (its attempts and retry delays)."""
        self.calls += 1
        try:
            yield
        finally:
            self.calls -= 1

    @contextlib.contextmanager
    def waiting_for(self) -> Iterator[None]:
        """One of its calls waits (a reply, a child run, a retry delay): while every call
        does, the run holds no slot and another run may start in its place."""
        self.waits += 1
        try:
            yield
        finally:
            self.waits -= 1

    def poke(self) -> None:
        for wake in list(self.wakes):
            if not wake.done():
                wake.set_result(None)

    def tagged(self, at: At, data: dict[str, Any]) -> dict[str, Any]:
        """A step event's data, with `attempt` when a later attempt runs (SPEC §7)."""
        attempt = self.step_attempts.get(at.path, 1)
        return {**data, "attempt": attempt} if attempt > 1 else data

    def withdraw(self, at: At) -> list[Question]:
        """The unanswered questions an earlier attempt of this step instance asked, taken
        out: the step asks something else now."""
        gone = [q for q in self.earlier if q.path == at.path and not q.answered]
        self.earlier = [q for q in self.earlier if q not in gone]
        return gone

    def take_earlier(self, at: At, prompt: str) -> Question | None:
        for question in self.earlier:
            if question.path == at.path and question.prompt == prompt:
                self.earlier.remove(question)
                return question
        return None

    def past_stopping(self) -> None:
        """The run is being ended or handed back: a stop must leave its task alone now.
        Cancelled while its last writes settle, the end or hand-back would never be
        stored; the run would keep its owner until its lease ran out, and the next claim
        would count as a crash."""
        self.stop_asked = True


def _starts_children(steps: tuple[StepDef, ...]) -> bool:
    return any(step.workflow is not None or _starts_children(step.steps)
               or (step.loop is not None and _starts_children(step.loop.steps)) for step in steps)


class LiveRuns:
    """This process's live runs by trace id, the room left for more (`max_runs`, and
    `max_per_user` runs of one owner; 0: no such cap), and whether the process is
    stopping (then no step starts and no run is claimed)."""

    def __init__(self, max_runs: int, max_per_user: int = 0) -> None:
        self.max_runs = max_runs
        self.max_per_user = max_per_user
        self.stopping = False
        self._runs: dict[str, LiveRun] = {}
        self._room_changed = asyncio.Event()
        self._reserved = 0  # room held for runs being claimed and started together
        self._reserved_by: Counter[str] = Counter()  # the same, by owner

    def __contains__(self, trace_id: str) -> bool:
        return trace_id in self._runs

    def __iter__(self) -> Iterator[LiveRun]:
        return iter(list(self._runs.values()))

    def __len__(self) -> int:
        return len(self._runs)

    def __getitem__(self, trace_id: str) -> LiveRun:
        return self._runs[trace_id]

    def get(self, trace_id: str) -> LiveRun | None:
        return self._runs.get(trace_id)

    def add(self, live: LiveRun) -> None:
        self._runs[live.trace_id] = live

    def remove(self, trace_id: str) -> None:
        """The run's task ended: its room is free for another run."""
        self._runs.pop(trace_id, None)
        if not self.stopping:
            self._room_changed.set()

    @property
    def room(self) -> int:
        # A run that waits holds no slot (SPEC §15b): not a parent waiting for its child
        # run (else a chain of runs could fill ORCHESTRA_MAX_RUNS with waiting parents and
        # never start its children), nor a run waiting for a reply or a retry delay.
        busy = sum(1 for live in self._runs.values() if live.holds_slot)
        return 0 if self.stopping else self.max_runs - busy - self._reserved

    def busy_by_owner(self) -> Counter[str]:
        """The slots each owner holds here (runs that hold one, and room reserved)."""
        busy = Counter(live.owner_id for live in self._runs.values() if live.holds_slot)
        busy.update(self._reserved_by)
        return busy

    def fit(self, owners: dict[str, str]) -> list[str]:
        """Of `{trace_id: owner_id}` (in the order to take them), those there is room for
        now: `room` in all, and under `max_per_user` for each owner."""
        room = self.room
        if not self.max_per_user:
            return list(owners)[:max(0, room)]
        busy, taken = self.busy_by_owner(), []
        for trace_id, owner in owners.items():
            if len(taken) >= room:
                break
            if busy[owner] < self.max_per_user:
                busy[owner] += 1
                taken.append(trace_id)
        return taken

    def room_for(self, owner_id: str) -> int:
        """The room for one more run of this owner (`room`, and its `max_per_user`)."""
        if not self.max_per_user:
            return self.room
        return min(self.room, self.max_per_user - self.busy_by_owner()[owner_id])

    @contextlib.contextmanager
    def reserving(self, owners: list[str]) -> Iterator[None]:
        """Hold room for these owners' runs (one each) while they are claimed and started
        (awaits), so that the claim loop meanwhile does not take more than `max_runs` (and
        `max_per_user`) allow."""
        self._reserved += len(owners)
        self._reserved_by.update(owners)
        try:
            yield
        finally:
            self._reserved -= len(owners)
            self._reserved_by.subtract(owners)
            self._reserved_by += Counter()  # drop the zeros

    def running(self) -> list[LiveRun]:
        """The runs whose task has not ended."""
        return [live for live in self._runs.values() if live.task is not None and not live.task.done()]

    # -- the claim loop's wake-up ---------------------------------------------------------
    def wake(self) -> None:
        """Look for runs to claim now (room was freed, a run was queued, or stopping)."""
        self._room_changed.set()

    async def wait_for_wake(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self._room_changed.wait()
        except TimeoutError:
            pass
        self._room_changed.clear()

    # -- stopping ---------------------------------------------------------------------------
    def stop(self, live: LiveRun, reason: StopReason, message: str = "") -> None:
        """Stop a live run once: CANCELLED/INTERRUPTED end it, HANDBACK gives it back to
        the store, LOST (another process holds it now) writes nothing more. A later LOST
        overrides an earlier reason: nothing may be written then."""
        if live.task is None or live.task.done():
            return
        if live.stop_asked:
            if reason == StopReason.LOST:
                live.stop_reason = StopReason.LOST
            return
        live.stop_asked, live.stop_reason = True, reason
        if message:
            live.stop_message = message
        if live.started:
            live.task.cancel()

    def begin_stopping(self) -> None:
        self.stopping = True
        self._room_changed.set()  # the claim loop ends now, not after its next wait
        for live in self._runs.values():
            live.poke()
