"""A run executing in this process (`LiveRun`) and the exceptions that end its task."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from orchestra.engine.instances import Finished
from orchestra.engine.questions import Question
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


class HandBack(Exception):
    """The process is stopping and nothing of the run is in flight: give it up now."""


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
    outputs: dict[str, Any] = field(default_factory=dict)  # top-level steps' outputs
    finished: Finished = field(default_factory=Finished)  # stored instances, by path
    waiting: set[str] = field(default_factory=set)  # instance paths waiting for a reply
    writes: RunWriter = field(default_factory=RunWriter)  # its store writes, in order
    wakes: set[asyncio.Future] = field(default_factory=set)  # schedulers waiting, one per level
    started: bool = False  # its task has begun (a task cancelled before that never runs)
    stop_asked: bool = False
    stop_status: str = RunStatus.CANCELLED  # or "interrupted", "handback", "lost"
    stop_reason: str = "The run was cancelled."

    def poke(self) -> None:
        for wake in list(self.wakes):
            if not wake.done():
                wake.set_result(None)

    def take_earlier(self, step_id: str, prompt: str) -> Question | None:
        path = path_of(step_id)
        for question in self.earlier:
            if question.path == path and question.prompt == prompt:
                self.earlier.remove(question)
                return question
        return None
