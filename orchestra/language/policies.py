"""Run-time rules of the workflow language that need no store and no provider (SPEC §7):
whether a step runs or is skipped, how a structured answer is read and what the model is
told when it does not fit, how long a retry waits. The scheduler calls these; keeping
them pure keeps them testable and the same for every process.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestra.language import schemas
from orchestra.language.expressions import ExpressionError, Scope
from orchestra.vocabulary import StepStatus


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a step whose dependencies have all ended: run it, or skip it
    (`reason`: "when" or "dependencies")."""

    run: bool
    reason: str | None = None


def step_scope(input: Any, states: dict[str, dict[str, Any]], sandbox: Any = None) -> Scope:
    """The variables a top-level step sees: `input` and `steps` {id: {output, status}};
    `sandbox` (the engine's) bounds the evaluations that do not run inline."""
    return Scope({"input": input, "steps": states}, sandbox)


async def decide(step: dict[str, Any], states: dict[str, dict[str, Any]], scope: Scope) -> Decision:
    """`should_run` for a step as the template stores it."""
    return await should_run(step.get("depends_on") or (), step.get("when"), states, scope)


async def should_run(depends_on: Sequence[str], when: str | None,
                     states: dict[str, dict[str, Any]], scope: Scope) -> Decision:
    """Skip propagation, then `when`. A step whose dependencies were all skipped is
    skipped; with some skipped and the rest succeeded (or failed under on_error
    continue) it runs; `when` false skips it. ExpressionError propagates (the step fails)."""
    if depends_on and all(states.get(d, {}).get("status") == StepStatus.SKIPPED for d in depends_on):
        return Decision(False, "dependencies")
    if when and not await scope.truth(when):
        return Decision(False, "when")
    return Decision(True)


async def read_structured(text: str, schema: Any, sandbox: Any = None) -> tuple[Any, list[dict[str, str]]]:
    """Parse a model's structured answer and validate it: (value, violations). A code
    fence around the JSON is tolerated; text that is no JSON is one violation. A check
    too large for the event loop runs in `sandbox` (the engine's), bounded."""
    raw = text.strip()
    if raw.startswith("```"):
        raw = raw.strip("`")
        raw = raw[raw.find("\n") + 1:] if "\n" in raw else raw
        raw = raw.rstrip("`").strip()
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return None, [{"field": "output", "problem": f"is not JSON ({exc.msg} at character {exc.pos})"}]
    return value, await schemas.check(value, schema, root="output", sandbox=sandbox)


def repair_prompt(violations: list[dict[str, str]], schema: Any) -> str:
    """What the model is told after an answer that does not fit the schema."""
    listed = "\n".join(f"- {v['field']}: {v['problem']}" for v in violations)
    return (
        "Your answer does not match the required JSON Schema:\n" + listed
        + "\nAnswer again with only the corrected JSON value. The schema:\n"
        + json.dumps(schema, separators=(",", ":"))
    )


def retry_delay(backoff_seconds: float, failed_attempt: int, *, jitter: float = 0.25,
                rng: random.Random | None = None) -> float:
    """Seconds to wait after attempt `failed_attempt` (1-based) failed: backoff doubled per
    attempt, ±25 % jitter."""
    base = backoff_seconds * (2 ** (failed_attempt - 1))
    if base <= 0:
        return 0.0
    spread = (rng or random).uniform(-jitter, jitter)
    return round(max(0.0, base * (1 + spread)), 3)


async def run_output(spec: dict[str, Any] | None, steps: list[dict[str, Any]],
                     states: dict[str, dict[str, Any]], input: Any, sandbox: Any = None) -> Any:
    """`template_output` for a template as stored."""
    return await template_output((spec or {}).get("output"), steps[-1]["id"] if steps else None,
                                 states, input, sandbox)


async def template_output(expr: str | None, last_step: str | None,
                          states: dict[str, dict[str, Any]], input: Any, sandbox: Any = None) -> Any:
    """The run's output: the template's `output` expression, else the last listed
    step's output. ExpressionError propagates (the run fails naming it)."""
    if expr:
        return await step_scope(input, states, sandbox).evaluate(expr)
    if last_step is None:
        return None
    return states.get(last_step, {}).get("output")


__all__ = ["Decision", "ExpressionError", "decide", "read_structured", "repair_prompt",
           "retry_delay", "run_output", "should_run", "step_scope", "template_output"]
