"""A run executing in this process (`LiveRun`) and the exceptions that end its task."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from orchestra.engine.questions import Question
from orchestra.engine.vocabulary import RunStatus
from orchestra.engine.writer import RunWriter
from orchestra.engine.tools.mcp.sessions import RunSessions


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
    outputs: dict[str, str] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)  # steps waiting for a reply
    writes: RunWriter = field(default_factory=RunWriter)  # its store writes, in order
    wake: asyncio.Future | None = None
    started: bool = False  # its task has begun (a task cancelled before that never runs)
    stop_asked: bool = False
    stop_status: str = RunStatus.CANCELLED  # or "interrupted", "handback", "lost"
    stop_reason: str = "The run was cancelled."
    mcp: RunSessions | None = None  # its MCP sessions, opened at their first call

    def mcp_sessions(self, allowed: frozenset[str]) -> RunSessions:
        """The run's MCP sessions (none is opened until a tool of a server is called)."""
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
