"""What a step instance stores as it goes: its row and its events, through the run's
writer, in order (SPEC §7, §8).

Every instance — a top-level step, a foreach item, a loop iteration, an inner step —
is one `run_step` row keyed by its path; its start, end, failure or skip is one group
write (`RunStore.store_instances`: the row change and its events in one transaction).
`live.finished` learns the outcome at once, so the scheduler never redoes an instance
whose end is on its way to the store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra import redaction
from orchestra.db.models import utcnow
from orchestra.engine.live import LiveRun, StepFailure
from orchestra.engine.model import At
from orchestra.engine.sizes import check_output
from orchestra.engine.store import RunStore
from orchestra.vocabulary import EventKind, StepStatus


def output_fields(value: Any, structured: bool = False) -> dict[str, Any]:
    """How an output is stored: text in `output`, a JSON value in `output_value`."""
    if not structured and (value is None or isinstance(value, str)):
        return {"output": value, "output_value": None}
    return {"output": None, "output_value": value}


class Records:
    """Instances' rows and events, submitted to their run's writer."""

    def __init__(self, store: RunStore, *, output_max_bytes: int) -> None:
        self.store = store
        self.output_max_bytes = output_max_bytes

    def _submit(self, live: LiveRun, path: str, step_id: str | None, values: dict[str, Any],
                events: list) -> asyncio.Future:
        events = [*live.carried.pop(path, ()), *events]
        return live.writes.submit_many(self.store.store_instances,
                                       (path, step_id, values, events), live.trace_id)

    def carry(self, live: LiveRun, at: At, kind: EventKind, data: dict[str, Any]) -> None:
        """An event of the instance stored with its next write (its end, or its retry), in
        the same transaction: one store round fewer on the way to the step's end."""
        live.carried.setdefault(at.path, []).append((kind, live.tagged(at, data), at))

    def started(self, live: LiveRun, at: At, data: dict[str, Any]) -> None:
        """A container (a foreach, an item, a loop, an iteration) started."""
        self._submit(live, at.path, at.step_id, {"status": StepStatus.RUNNING, "started_at": utcnow()},
                     [(EventKind.STEP_STARTED, data, at)])

    def attempt_started(self, live: LiveRun, at: At, attempt: int, data: dict[str, Any], *,
                        started_at: Any = None) -> None:
        """A call's attempt started (`step_started`, with `attempt` from the second on);
        `started_at`: the instance's start when the step already knows it (a code step's clock)."""
        values: dict[str, Any] = {"status": StepStatus.RUNNING, "attempt": attempt}
        if attempt == 1:
            values["started_at"] = started_at or utcnow()
        label = live.item_labels.get(at.path)
        if label:  # a foreach item: named by its value (SPEC §8), whatever its items expression
            data = {**data, "item": label}
        self._submit(live, at.path, at.step_id, values, [(EventKind.STEP_STARTED, live.tagged(at, data), at)])

    def call_succeeded(self, live: LiveRun, at: At, output: Any, usage: dict[str, int] | None,
                       pending_text: str, *, structured: bool,
                       spend: dict[str, Any] | None = None, key: str | None = None) -> asyncio.Future:
        """A call's output, with the last token text not yet appended, in one write;
        `spend`: its cost fields (engine/spend.py), `cost_usd` also on `step_finished`;
        `key`: its reuse key (engine/reuse.py)."""
        spend = spend or {}
        tokens = [(EventKind.TOKEN, live.tagged(at, {"text": pending_text}), at)] if pending_text else []
        data = {"output": output, "usage": usage} | ({"cost_usd": spend["cost_usd"]} if spend else {})
        finished = (EventKind.STEP_FINISHED, live.tagged(at, data), at)
        live.finished.set(at.path, StepStatus.SUCCEEDED, output)
        return self._submit(live, at.path, None, {
            "status": StepStatus.SUCCEEDED, "usage": usage, "finished_at": utcnow(), **spend,
            "reuse_key": key, **output_fields(output, structured)}, [*tokens, finished])

    def reused(self, live: LiveRun, at: At, output: Any, key: str, structured: bool,
               data: dict[str, Any]) -> asyncio.Future:
        """A fork's call copied from its source at run time (engine/reuse.py): its row
        `reused` with the source's output and the call's key, and `step_reused {data}`."""
        now = utcnow()
        live.finished.set(at.path, StepStatus.SUCCEEDED, output)
        return self._submit(live, at.path, at.step_id, {
            "status": StepStatus.SUCCEEDED, "reused": True, "reuse_key": key, "started_at": now,
            "finished_at": now, **output_fields(output, structured)}, [(EventKind.STEP_REUSED, data, at)])

    def succeeded(self, live: LiveRun, at: At, output: Any, data: dict[str, Any]) -> asyncio.Future:
        """A container's (an item's, an iteration's) end; the future of its last write.
        An output past the step output bound fails the instance instead (StepFailure)."""
        try:
            check_output(output, limit=self.output_max_bytes, of=f"step '{at.path}'")
        except StepFailure as failure:
            self.failed(live, at, failure.message)
            raise
        live.finished.set(at.path, StepStatus.SUCCEEDED, output)
        return self._submit(live, at.path, None,
                            {"status": StepStatus.SUCCEEDED, "finished_at": utcnow(), **output_fields(output)},
                            [(EventKind.STEP_FINISHED, {"output": output, **data}, at)])

    def failed(self, live: LiveRun, at: At, message: str,
               spend: dict[str, Any] | None = None) -> asyncio.Future:
        """An instance's failure and its `step_failed` (an upsert: an item that failed
        before it started, at its prompt, has no row yet); the future of that write.
        `spend`: the cost fields of a call's failed attempts."""
        live.finished.set(at.path, StepStatus.FAILED)
        message = redaction.scrub_text(message)  # a provider key or MCP header an SDK quoted (SPEC §15b)
        return self._submit(live, at.path, at.step_id,
                            {"status": StepStatus.FAILED, "error": message, "finished_at": utcnow(),
                             **(spend or {})},
                            [(EventKind.STEP_FAILED, live.tagged(at, {"error": message}), at)])

    def skipped(self, live: LiveRun, at: At, reason: str) -> None:
        now = utcnow()
        live.finished.set(at.path, StepStatus.SKIPPED)
        self._submit(live, at.path, at.step_id,
                     {"status": StepStatus.SKIPPED, "started_at": now, "finished_at": now},
                     [(EventKind.STEP_SKIPPED, {"reason": reason}, at)])

    def retrying(self, live: LiveRun, at: At, attempt: int, error: str, delay: float) -> None:
        error = redaction.scrub_text(error)
        live.writes.submit(self.store.append_many, live.trace_id, [
            *live.carried.pop(at.path, ()),
            (EventKind.STEP_RETRYING, {"attempt": attempt, "error": error, "delay_seconds": delay}, at)])

    def event(self, live: LiveRun, at: At, kind: EventKind, data: dict[str, Any]) -> asyncio.Future:
        """One event of a step instance (`token`, `tool_call`, …), tagged with its attempt."""
        return live.writes.submit(self.store.append, live.trace_id, kind, live.tagged(at, data),
                                  step_id=at)

    async def stored(self, live: LiveRun, write: asyncio.Future | None = None) -> None:
        """Wait until `write` (else everything submitted so far) is stored; a failed write
        raises its error (the run ends as for any failed write)."""
        if write is None:
            write = live.writes.submit(_nothing)
        await asyncio.shield(write)
        await self.store.release()


async def _nothing() -> None:
    """A write that writes nothing: its future is done once every write before it is."""
