"""A run executing in this process (`LiveRun`) and the exceptions that end its task."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from orchestra.egress import EgressPolicy
from orchestra.engine.instances import Finished
from orchestra.engine.questions import Question
from orchestra.engine.tools.mcp.sessions import RunSessions
from orchestra.engine.vocabulary import RunStatus
from orchestra.engine.writer import RunWriter


class StepAt(str):
    """A step's template id that also knows the instance it names (SPEC §8): it *is* the
    id (`research`), so everything that tags events with a step id keeps doing so, and
    `path` (`research[3]`) goes with it into events, rows and questions."""

    __slots__ = ("path",)

    def __new__(cls, step_id: str, path: str) -> "StepAt":
        made = super().__new__(cls, step_id)
        made.path = path
        return made


def path_of(sid: str) -> str:
    """The instance path a step id stands for (a plain id is its own path)."""
    return getattr(sid, "path", sid)


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
    steps: list[dict[str, Any]]
    attempt: int = 1
    spec: dict[str, Any] = field(default_factory=dict)  # input_schema, limits, output
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
    executions: int = 0  # step executions so far (limits.max_steps): attempts included
    finished: Finished = field(default_factory=Finished)  # stored instances, by path (SPEC §8)
    waiting: set[str] = field(default_factory=set)  # instance paths waiting for a reply
    writes: RunWriter = field(default_factory=RunWriter)  # its store writes, in order
    wakes: set[asyncio.Future] = field(default_factory=set)  # schedulers waiting, one per level
    started: bool = False  # its task has begun (a task cancelled before that never runs)
    stop_asked: bool = False
    stop_status: str = RunStatus.CANCELLED  # or "interrupted", "handback", "lost"
    stop_reason: str = "The run was cancelled."
    mcp: RunSessions | None = None  # its MCP sessions, opened at their first call
    # Spend (engine/spend.py): the budget in pico-dollars (None: none), settled changes
    # not yet stored, and each running instance's calls and cost so far.
    budget_pusd: int | None = None
    spend_pending: int = 0
    spends: dict[str, Any] = field(default_factory=dict)
    reserved_calls: int = 0  # calls in flight here holding a reservation
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set (and renewed) at each settle

    def mcp_sessions(self, allowed: frozenset[str], egress: EgressPolicy) -> RunSessions:
        """The run's MCP sessions (none is opened until a tool of a server is called)."""
        if self.mcp is None:
            self.mcp = RunSessions(allowed, egress)
        return self.mcp

    def poke(self) -> None:
        for wake in list(self.wakes):
            if not wake.done():
                wake.set_result(None)

    def tagged(self, step_id: str, data: dict[str, Any]) -> dict[str, Any]:
        """A step event's data, with `attempt` when a later attempt runs (SPEC §7)."""
        attempt = self.step_attempts.get(path_of(step_id), 1)
        return {**data, "attempt": attempt} if attempt > 1 else data

    def step(self, step_id: str) -> dict[str, Any]:
        return next(s for s in self.steps if s["id"] == step_id)

    def withdraw(self, step_id: str) -> list[Question]:
        """The unanswered questions an earlier attempt of this step instance asked, taken
        out: the step asks something else now."""
        path = path_of(step_id)
        gone = [q for q in self.earlier if q.path == path and not q.answered]
        self.earlier = [q for q in self.earlier if q not in gone]
        return gone

    def take_earlier(self, step_id: str, prompt: str) -> Question | None:
        path = path_of(step_id)
        for question in self.earlier:
            if question.path == path and question.prompt == prompt:
                self.earlier.remove(question)
                return question
        return None
