"""Prompt rendering: `{{ expr }}` filled from a run's state (SPEC §4, §7).

`{{input}}` and `{{steps.<id>.output}}` keep their v1 meaning; anything else between the
braces is a CEL expression (`orchestra.language.expressions`).
"""

from __future__ import annotations

from typing import Any

from orchestra.language.expressions import PLACEHOLDER, Scope, render
from orchestra.vocabulary import StepStatus

__all__ = ["PLACEHOLDER", "render_prompt"]


async def render_prompt(template: str, *, input: Any, outputs: dict[str, Any] | None = None,
                        scope: Scope | None = None) -> str:
    """Fill every `{{ … }}` of a validated prompt. `scope` (input and step states, and the
    engine's sandbox) is shared with the step's other expressions; `outputs` ({id:
    output}) builds one without a sandbox (expressions that must run bounded then fail)."""
    if scope is None:
        states = {sid: {"output": out, "status": StepStatus.SUCCEEDED} for sid, out in (outputs or {}).items()}
        scope = Scope({"input": input, "steps": states})
    return await render(template, scope)
