"""The run event log: stored first, then published on an in-process bus.

`EventLog.append` gives each event the next per-run `seq`, stores it in `run_event`
and only then hands it to live subscribers. `follow()` is what a stream reads: it
subscribes *first*, replays the stored events after `Last-Event-ID`, then forwards
live ones, skipping any `seq` already sent — so a resume has no gap and no duplicate.
A subscriber that falls behind is dropped from the live feed (its queue is bounded)
and catches up from the store; when the run executes in another process the store is
polled instead. `TokenCoalescer` batches token deltas (about every 50 ms).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from peewee import IntegrityError, fn

from orchestra.db.models import RunEvent, WorkflowRun, iso, utcnow

KINDS = (
    "run_started",
    "step_started",
    "token",
    "tool_call",
    "tool_result",
    "reply_requested",
    "reply_received",
    "step_finished",
    "step_failed",
    "run_finished",
    "run_failed",
    "run_cancelled",
)
TERMINAL = frozenset({"run_finished", "run_failed", "run_cancelled"})
SUBSCRIBER_QUEUE = 1024
PING = None  # what `follow` yields when a keep-alive comment is due


class RunGone(Exception):
    """The run was deleted, or already has its terminal event: nothing more may be appended."""


class Event:
    """One stored event; `frame()` is its SSE text, built once and shared by subscribers."""

    __slots__ = ("seq", "kind", "data", "_frame")

    def __init__(self, seq: int, kind: str, data: dict[str, Any]) -> None:
        self.seq = seq
        self.kind = kind
        self.data = data
        self._frame: bytes | None = None

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL

    def frame(self) -> bytes:
        if self._frame is None:
            payload = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
            self._frame = f"id: {self.seq}\nevent: {self.kind}\ndata: {payload}\n\n".encode()
        return self._frame

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "data": self.data}

    def __repr__(self) -> str:
        return f"Event({self.seq}, {self.kind!r})"


class Subscription:
    """A bounded queue of live events for one stream reader."""

    __slots__ = ("trace_id", "queue", "dropped")

    def __init__(self, trace_id: str, maxsize: int) -> None:
        self.trace_id = trace_id
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize)
        self.dropped = False


class EventLog:
    """Store-then-publish log of run events, with live subscriptions (one per process)."""

    def __init__(self, db: Any, *, queue_size: int = SUBSCRIBER_QUEUE) -> None:
        self.db = db
        self.queue_size = queue_size
        self._subs: dict[str, set[Subscription]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._last: dict[str, int] = {}

    # -- writing ----------------------------------------------------------------------
    async def append(
        self, trace_id: str, kind: str, data: dict[str, Any] | None = None, *, step_id: str | None = None
    ) -> Event:
        """Store the event with the next seq, then publish it. Raises RunGone."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        lock = self._locks.setdefault(trace_id, asyncio.Lock())
        async with lock:
            for _ in range(20):
                last = self._last.get(trace_id)
                if last is None:
                    last = await self.max_seq(trace_id)
                seq = last + 1
                now = utcnow()
                payload: dict[str, Any] = {"trace_id": trace_id, "seq": seq, "ts": iso(now)}
                if step_id is not None:
                    payload["step_id"] = step_id
                payload.update(data or {})
                try:
                    await RunEvent.acreate(run=trace_id, seq=seq, kind=kind, data=payload, created_at=now)
                except IntegrityError:
                    # Another process appended (or the run is gone): re-read and retry.
                    self._last.pop(trace_id, None)
                    await self._check_open(trace_id)
                    continue
                self._last[trace_id] = seq
                event = Event(seq, kind, payload)
                self.publish(event, trace_id)
                if event.terminal:
                    self.forget(trace_id)
                return event
        raise RunGone(f"could not append to run {trace_id}")

    async def _check_open(self, trace_id: str) -> None:
        if await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id) is None:
            raise RunGone(f"run {trace_id} no longer exists")
        last = await self.last_event(trace_id)
        if last is not None and last.terminal:
            raise RunGone(f"run {trace_id} has already ended")

    def publish(self, event: Event, trace_id: str) -> None:
        """Hand a stored event to every live subscriber; drop those that are full."""
        subs = self._subs.get(trace_id)
        if not subs:
            return
        for sub in list(subs):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                sub.dropped = True
                subs.discard(sub)

    def forget(self, trace_id: str) -> None:
        """Drop the cached seq and lock of a run that has ended."""
        self._last.pop(trace_id, None)
        lock = self._locks.get(trace_id)
        if lock is not None and not lock.locked():
            self._locks.pop(trace_id, None)

    async def release(self) -> None:
        """Give the current task's pooled connection back before a long wait.

        pwasyncio binds a connection to each task until the task ends; a stream or a
        run that waits for minutes must not hold one, or a few of them drain the pool.
        """
        try:
            if not self.db.in_transaction():
                await self.db.aclose()
        except Exception:  # noqa: BLE001 - releasing is best effort
            pass

    # -- reading ----------------------------------------------------------------------
    async def max_seq(self, trace_id: str) -> int:
        rows = await self.db.list(
            RunEvent.select(fn.MAX(RunEvent.seq).alias("m")).where(RunEvent.run == trace_id).dicts()
        )
        return int(rows[0]["m"] or 0) if rows else 0

    async def stored(self, trace_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        query = (
            RunEvent.select(RunEvent.seq, RunEvent.kind, RunEvent.data)
            .where((RunEvent.run == trace_id) & (RunEvent.seq > after))
            .order_by(RunEvent.seq)
        )
        if limit:
            query = query.limit(limit)
        return [Event(r.seq, r.kind, r.data) for r in await self.db.list(query)]

    async def last_event(self, trace_id: str) -> Event | None:
        query = (
            RunEvent.select(RunEvent.seq, RunEvent.kind, RunEvent.data)
            .where(RunEvent.run == trace_id)
            .order_by(RunEvent.seq.desc())
            .limit(1)
        )
        rows = await self.db.list(query)
        return Event(rows[0].seq, rows[0].kind, rows[0].data) if rows else None

    # -- subscribing ------------------------------------------------------------------
    def subscribe(self, trace_id: str) -> Subscription:
        sub = Subscription(trace_id, self.queue_size)
        self._subs.setdefault(trace_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.trace_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                self._subs.pop(sub.trace_id, None)

    def subscriber_count(self, trace_id: str) -> int:
        return len(self._subs.get(trace_id, ()))

    async def follow(
        self,
        trace_id: str,
        *,
        after: int = 0,
        is_live: Callable[[], bool] = lambda: True,
        ping_every: float = 15.0,
        poll_every: float = 0.2,
    ) -> AsyncIterator[Event | None]:
        """Every event after `after`, once and in order, ending with the terminal one.

        Yields `PING` (None) when `ping_every` seconds pass without an event. While
        `is_live()` is false (the run executes elsewhere) the store is polled.
        """
        last = after
        sub = self.subscribe(trace_id)
        next_ping = time.monotonic() + ping_every
        catch_up = True
        try:
            while True:
                if catch_up:
                    catch_up = False
                    for event in await self.stored(trace_id, after=last):
                        yield event
                        last = event.seq
                        next_ping = time.monotonic() + ping_every
                        if event.terminal:
                            return
                if sub.dropped and sub.queue.empty():
                    self.unsubscribe(sub)
                    sub = self.subscribe(trace_id)
                    catch_up = True
                    continue
                if not sub.queue.empty():
                    event = sub.queue.get_nowait()
                else:
                    await self.release()
                    live = is_live()
                    wait = max(next_ping - time.monotonic(), 0.0)
                    if not live:
                        wait = min(wait, poll_every)
                    try:
                        async with asyncio.timeout(wait):  # no extra task, unlike wait_for
                            event = await sub.queue.get()
                    except (asyncio.TimeoutError, TimeoutError):
                        if time.monotonic() >= next_ping:
                            yield PING
                            next_ping = time.monotonic() + ping_every
                        if not live:
                            catch_up = True
                        continue
                if event.seq <= last:
                    continue
                if event.seq != last + 1:  # appended by another process: read the gap
                    catch_up = True
                    continue
                yield event
                last = event.seq
                next_ping = time.monotonic() + ping_every
                if event.terminal:
                    return
        finally:
            self.unsubscribe(sub)


class TokenCoalescer:
    """Collect token deltas of one step and append them as one `token` event per interval."""

    def __init__(
        self, emit: Callable[[str], Awaitable[Any]], *, interval: float = 0.05
    ) -> None:
        self._emit = emit
        self.interval = interval
        self._buffer: list[str] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task | None = None
        self._sleeping_timer: asyncio.Task | None = None
        self._error: Exception | None = None
        self.emitted = False  # whether any text has been handed to `add`

    def add(self, text: str) -> None:
        if not text:
            return
        self.emitted = True
        self._buffer.append(text)
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._later())
            self._sleeping_timer = self._timer

    async def _later(self) -> None:
        await asyncio.sleep(self.interval)
        self._sleeping_timer = None
        try:
            await self._flush()
        except Exception as exc:  # noqa: BLE001 - re-raised by the next flush()
            self._error = exc

    async def flush(self) -> None:
        """Append whatever is buffered now (call before any other event of the step)."""
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            if self._sleeping_timer is timer:  # still sleeping: cancel it, we flush now
                timer.cancel()
            else:  # already flushing: let that append finish first, in order
                await asyncio.shield(timer)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        await self._flush()

    async def _flush(self) -> None:
        async with self._lock:
            if not self._buffer:
                return
            text = "".join(self._buffer)
            self._buffer.clear()
            await self._emit(text)

    async def close(self) -> None:
        """Stop the timer without emitting (the step was cancelled)."""
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            timer.cancel()
        self._buffer.clear()
