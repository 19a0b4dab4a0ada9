"""The events of the instances a new run starts with (copied, not run): a retry's steps
say `step_finished {reused: true}` (SPEC §7); a fork's instances say `step_reused
{source_trace_id, output}` (SPEC §13), one per instance, items and iterations included,
with `overridden: true` for a step whose output the fork's `outputs` set."""

from __future__ import annotations

from typing import Any

from orchestra.engine import instances
from orchestra.engine.live import LiveRun
from orchestra.engine.model import At
from orchestra.engine.vocabulary import EventKind


def reused_events(live: LiveRun) -> list[tuple[str, dict[str, Any], At | str]]:
    """(kind, data, step) of every instance stored as reused before the run started."""
    if not live.forked_from:
        return [(EventKind.STEP_FINISHED, {"output": state["output"], "reused": True}, sid)
                for sid, state in live.states.items()]
    source = live.forked_from.get("trace_id")
    overridden = set(live.forked_from.get("outputs") or [])
    events = []
    for path, record in live.finished.records.items():
        step_id = instances.parse(path)[-1].step_id
        data: dict[str, Any] = {"output": record.output, "source_trace_id": source}
        if path in overridden:
            data["overridden"] = True
        events.append((EventKind.STEP_REUSED, data, At(step_id, path)))
    return events
