"""Prompt rendering: `{{input}}` and `{{steps.<id>.output}}` filled from a run's state."""

from __future__ import annotations

import re

PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")


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
