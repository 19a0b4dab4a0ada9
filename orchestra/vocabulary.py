"""The words of the API as string enums: run and step statuses and event kinds (SPEC §4),
a schedule fire's outcome and a webhook delivery's status (SPEC §11).

Each member *is* its string (StrEnum), so it is stored, compared and sent as JSON
exactly as the bare literal was; the enums give those strings one home and a name a
reader (and a type checker) can follow. A leaf module: the engine, the services, the
web layer, the CLI and its HTTP client all read it.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_REPLY = "waiting_reply"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    WAITING_BUDGET = "waiting_budget"  # SPEC §12: paused until its budget is raised


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_REPLY = "waiting_reply"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"


class EventKind(StrEnum):
    RUN_STARTED = "run_started"
    STEP_STARTED = "step_started"
    TOKEN = "token"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    REPLY_REQUESTED = "reply_requested"
    REPLY_RECEIVED = "reply_received"
    REPLY_WITHDRAWN = "reply_withdrawn"
    STEP_FINISHED = "step_finished"
    STEP_FAILED = "step_failed"
    STEP_SKIPPED = "step_skipped"  # SPEC §7: `when` false, or every dependency skipped
    STEP_RETRYING = "step_retrying"  # SPEC §7: a failed attempt runs again after a delay
    REPLY_TIMED_OUT = "reply_timed_out"  # SPEC §7: a human step's default became its output
    CHILD_STARTED = "child_started"  # SPEC §14: a workflow step started its child run
    CHILD_FINISHED = "child_finished"  # SPEC §14: ... and that run ended
    STEP_REUSED = "step_reused"  # SPEC §13: a fork's instance copied from its source run
    RUN_RESUMED = "run_resumed"
    RUN_FINISHED = "run_finished"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"  # SPEC §12: on_budget fail, just before run_failed
    BUDGET_EXHAUSTED = "budget_exhausted"  # SPEC §12: on_budget pause, the run waits


class FireOutcome(StrEnum):
    """What one due time of a schedule came to (`schedule_fire.outcome`)."""

    STARTED = "started"  # its run was started
    SKIPPED = "skipped"  # overlap: skip, the previous run still active
    MISSED = "missed"  # catch-up policy: not fired late
    FAILED = "failed"  # the run could not be started (the fire's error says why)


class DeliveryStatus(StrEnum):
    """A webhook delivery (`webhook_delivery.status`)."""

    PENDING = "pending"  # queued or between attempts
    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # retried for the whole retry window, never a 2xx


#: A run that is not over: someone holds it, or will claim it.
ACTIVE: tuple[RunStatus, ...] = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING_REPLY)
#: A run that is over; nothing more is appended to it.
FINISHED: tuple[RunStatus, ...] = (
    RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED,
)
#: The events that end a run's stream.
TERMINAL: frozenset[EventKind] = frozenset(
    {EventKind.RUN_FINISHED, EventKind.RUN_FAILED, EventKind.RUN_CANCELLED}
)
#: Every kind, in the order SPEC lists them.
KINDS: tuple[EventKind, ...] = tuple(EventKind)
