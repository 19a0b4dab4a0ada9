"""What the engine calls to be observed: one call per place, each a line in the engine.

- `observed_run(trace_id, parent, attempt, coro)`: the run's task body. Binds the run's
  id to its log lines, counts it in flight, and makes its `run` span (a child of the
  stored `parent`, so every attempt, in any process, joins the run's trace).
- `run_began(trace_id, resumed=)`: `run_started` or `run_resumed` was written.
- `run_ended(trace_id, status)`: the terminal event is stored (the one way a run ends).
- `run_outcome(trace_id, outcome)`: it left this process otherwise (`handback`, `lost`).
- `observed_step(step_id, coro)`, `observed_tool(name, coro)`: a step's task, a tool call.
- Store and lease hooks are in `metrics`: `store_unavailable()`, `store_available()`,
  `lease_renewals(outcome, count)`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from orchestra.observability import context, metrics, tracing
from orchestra.vocabulary import StepStatus

T = TypeVar("T")

_spans: dict[str, Any] = {}  # trace_id -> the run span of its task here


async def observed_run(trace_id: str, parent: str | None, attempt: int, work: Awaitable[T]) -> T:
    context.bind_run(trace_id)
    metrics.runs_in_flight(1)
    try:
        with tracing.span("run", parent=parent, detached=True, error_outcomes=(),
                          attributes={"orchestra.trace_id": trace_id, "orchestra.attempt": attempt}) as span:
            _spans[trace_id] = span
            try:
                return await work
            finally:
                _spans.pop(trace_id, None)
    finally:
        metrics.runs_in_flight(-1)


def run_began(trace_id: str, *, resumed: bool) -> None:
    metrics.run_started(resumed=resumed)
    _outcome(trace_id, "resumed" if resumed else "started")


def run_ended(trace_id: str, status: str) -> None:
    metrics.run_ended(str(status))
    _outcome(trace_id, str(status))


def run_outcome(trace_id: str, outcome: str) -> None:
    _outcome(trace_id, outcome)


def _outcome(trace_id: str, outcome: str) -> None:
    span = _spans.get(trace_id)
    if span is not None:
        with contextlib.suppress(Exception):  # a span attribute is never worth a failed run
            span.set_attribute("orchestra.outcome", outcome)


async def observed_step(step_id: str, work: Awaitable[T]) -> T:
    """A step instance's task (`research[3]` too): its span, and
    `orchestra_steps_total{status}` by how it ended (a failure a policy lets the run
    survive is returned as the step's state, not raised)."""
    status: str = StepStatus.SUCCEEDED
    with tracing.span(f"step {step_id}", attributes={"orchestra.step_id": step_id}) as span:
        try:
            result = await work
            if isinstance(result, dict) and result.get("status"):  # an ended step's state
                status = str(result["status"])
            return result
        except asyncio.CancelledError:
            status = StepStatus.CANCELLED
            raise
        except Exception:
            status = StepStatus.FAILED
            raise
        finally:
            metrics.step_ended(status)
            span.set_attribute("orchestra.outcome", status)


async def observed_tool(name: str, work: Awaitable[T], *, known: bool = True) -> T:
    """A tool call: its span, and `orchestra_tool_calls_total{tool,outcome}` (a name the
    registry does not know — a model's invention — is counted as `unknown`)."""
    outcome = "ok"
    with tracing.span(f"tool {name}", attributes={"orchestra.tool": name}):
        try:
            return await work
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            metrics.tool_call(name if known else "unknown", outcome)
