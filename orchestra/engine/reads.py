"""What requests read about a run's events and questions, straight from the store: the
run detail, the events page and a stream's start need no engine built for them."""

from __future__ import annotations

from typing import Any

from orchestra.engine.questions import open_questions as _open
from orchestra.engine.store.events import Event, EventLog


async def last_event(db: Any, trace_id: str) -> Event | None:
    """The run's last stored event (its `seq` is the run's last seq), or None."""
    return await EventLog(db).last_event(trace_id)


async def stored_events(db: Any, trace_id: str, *, after: int = 0,
                        limit: int | None = None) -> list[Event]:
    """Stored events with `seq > after`, in order, at most `limit`."""
    return await EventLog(db).stored(trace_id, after=after, limit=limit)


async def open_questions(db: Any, trace_id: str) -> list[dict[str, str]]:
    """`[{request_id, step_id, prompt}]` the run waits on, oldest first."""
    return _open(await EventLog(db).questions(trace_id))
