"""The shape of a template's steps (SPEC §8): which are containers, what they hold, and
every step of a template walked in order, inner ones included. Pure functions of the
template, used when it is saved (validation, composition, diffs) and when it runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAX_DEPTH = 3  # foreach and loop nest this many levels at most (SPEC §8)


def kind_of(step: dict[str, Any]) -> str:
    """'foreach', 'loop' or 'step' (one agent or human call)."""
    if step.get("foreach") is not None:
        return "foreach"
    if step.get("loop") is not None:
        return "loop"
    return "step"


def inner_steps(step: dict[str, Any]) -> list[dict[str, Any]]:
    """The small workflow a container runs per item or iteration ([] for a plain step or
    a foreach of one agent or human step per item)."""
    if step.get("loop") is not None:
        return list(step["loop"].get("steps") or [])
    if step.get("foreach") is not None:
        return list(step.get("steps") or [])
    return []


def walk(steps: list[dict[str, Any]], depth: int = 0, where: str = "steps") -> Iterator[
        tuple[dict[str, Any], int, str]]:
    """Every step of a template, inner ones included: (step, container depth, field path).
    Depth 0 is a top-level step; a step inside one container has depth 1."""
    for n, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        here = f"{where}.{n}"
        yield step, depth, here
        if step.get("loop") is not None and isinstance(step["loop"], dict):
            yield from walk(step["loop"].get("steps") or [], depth + 1, f"{here}.loop.steps")
        elif step.get("foreach") is not None and isinstance(step.get("steps"), list):
            yield from walk(step["steps"], depth + 1, f"{here}.steps")


def nesting(step: dict[str, Any]) -> int:
    """Container levels of a step: 0 for a plain step, 1 for a foreach or loop of plain
    steps, 2 for one holding another, …"""
    if kind_of(step) == "step":
        return 0
    return 1 + max((nesting(s) for s in inner_steps(step) if isinstance(s, dict)), default=0)


def dependents(steps: list[dict[str, Any]], root: str) -> set[str]:
    """`root` and every top-level step that depends on it, directly or through others
    (what a retry from `root` or a fork of it runs again)."""
    found, changed = {root}, True
    while changed:
        changed = False
        for step in steps:
            if step["id"] not in found and found & set(step.get("depends_on") or []):
                found.add(step["id"])
                changed = True
    return found
