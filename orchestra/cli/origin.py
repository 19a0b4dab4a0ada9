"""What started a run, in a few words, for `workflow list` and `workflow show`.

A run's `trigger` (docs/api.md, "Runs") says a schedule, a webhook, an MCP call or any
later kind (an experiment's); without one, a child run names its parent, a retry or a
fork its source, and the rest were started directly (the console, the CLI or a key).
"""

from __future__ import annotations

from typing import Any

KINDS = {"schedule": "schedule", "webhook": "webhook", "mcp": "MCP", "experiment": "experiment"}


def started_by(run: dict[str, Any], *, full: bool = False) -> str:
    """`schedule 5b0e1c2d`, `webhook …`, `MCP research`, `child of …`, `retry of …`,
    `fork of …` or `direct`; `full`: whole ids and the schedule's due time."""

    def short(value: Any) -> str:
        text = str(value or "")
        return text if full else text[:8]

    trigger = run.get("trigger") or None
    if isinstance(trigger, dict) and trigger.get("kind"):
        kind = str(trigger["kind"])
        shown = KINDS.get(kind, kind)
        if kind == "schedule":
            due = f" (due {trigger['due_at']})" if full and trigger.get("due_at") else ""
            return f"{shown} {short(trigger.get('schedule_id'))}{due}".rstrip()
        if kind == "webhook":
            return f"{shown} {short(trigger.get('hook_id'))}".rstrip()
        if kind == "mcp":
            return f"{shown} {trigger.get('tool') or ''}".rstrip()
        return shown
    if run.get("parent"):
        parent = run["parent"]
        where = f" (step {parent['path']})" if full and parent.get("path") else ""
        return f"child of {short(parent.get('trace_id'))}{where}"
    if run.get("retry_of"):
        return f"retry of {short(run['retry_of'])}"
    if run.get("forked_from"):
        return f"fork of {short(run['forked_from'].get('trace_id'))}"
    return "direct"
