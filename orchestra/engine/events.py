"""The run event log: stored first, then published on an in-process bus.

`EventLog.append` gives each event the next per-run `seq`, stores it in `run_event`
and only then hands it to live subscribers. `follow()` is what a stream reads: it
subscribes *first*, replays the stored events after `Last-Event-ID`, then forwards
live ones, skipping any `seq` already sent — so a resume has no gap and no duplicate.
A stream writer may give `follow()` a *sink*: once the reader has caught up, `publish`
hands each event straight to the sink (a socket write of bytes built once per event),
so a thousand readers cost a thousand writes per event, not a thousand task wake-ups.
A subscriber that falls behind (full queue, or a sink that refuses) is dropped from
the live feed and catches up from the store; when the run executes in another process
the store is polled instead. `TokenCoalescer` batches token deltas (about every 50 ms).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from peewee import IntegrityError, fn

from orchestra.db.database import release_connection
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
FANOUT_SLICE = 100  # socket writes per loop turn: timers and reads run between slices
PING = None  # what `follow` yields when a keep-alive comment is due


class RunGone(Exception):
    """The run was deleted, or already has its terminal event: nothing more may be appended."""


class Event:
    """One stored event; `frame()` is its SSE text, built once and shared by subscribers."""

    __slots__ = ("seq", "kind", "data", "_frame", "_chunk")

    def __init__(self, seq: int, kind: str, data: dict[str, Any]) -> None:
        self.seq = seq
        self.kind = kind
        self.data = data
        self._frame: bytes | None = None
        self._chunk: bytes | None = None

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL

    def frame(self) -> bytes:
        if self._frame is None:
            payload = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
            self._frame = f"id: {self.seq}\nevent: {self.kind}\ndata: {payload}\n\n".encode()
        return self._frame

    def chunk(self) -> bytes:
        """The frame as one HTTP/1.1 chunk (hex size, CRLF, frame, CRLF), built once."""
        if self._chunk is None:
            frame = self.frame()
            self._chunk = b"%x\r\n%b\r\n" % (len(frame), frame)
        return self._chunk

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "data": self.data}

    def __repr__(self) -> str:
        return f"Event({self.seq}, {self.kind!r})"


Sink = Callable[[Event], bool]  # writes an event now; False when the reader cannot keep up


class Subscription:
    """One stream reader's live feed: a bounded queue, or (caught up) a sink.

    In sink mode `push` writes each next event at once and records it in `last`; it
    falls back to the queue (and wakes the reader) on a gap, a refusal or the end (the
    fan-out wakes readers of the terminal event after writing it to all of them).
    """

    __slots__ = (
        "trace_id", "queue", "dropped", "sink", "last", "ended", "gap", "written_at", "waiter"
    )

    def __init__(self, trace_id: str, maxsize: int) -> None:
        self.trace_id = trace_id
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize)
        self.dropped = False
        self.sink: Sink | None = None
        self.last = 0
        self.ended = False  # the terminal event went through the sink
        self.gap = False
        self.written_at = 0.0
        self.waiter: asyncio.Future | None = None

    def push(self, event: Event, now: float) -> bool:
        """Sink mode: write `event` if it is the next one. False: drop this subscriber."""
        seq = event.seq
        if seq <= self.last:
            return True
        if seq != self.last + 1:  # appended by another process: the reader reads the gap
            self.sink, self.gap = None, True
            self.wake()
            return True
        if not self.sink(event):
            self.sink, self.dropped = None, True
            self.wake()
            return False
        self.last, self.written_at = seq, now
        if event.terminal:  # the fan-out wakes the reader once every reader has it
            self.sink, self.ended = None, True
        return True

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class EventLog:
    """Store-then-publish log of run events, with live subscriptions (one per process)."""

    def __init__(self, db: Any, *, queue_size: int = SUBSCRIBER_QUEUE) -> None:
        self.db = db
        self.queue_size = queue_size
        self._subs: dict[str, set[Subscription]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._last: dict[str, int] = {}
        self._fanout: dict[str, deque[list]] = {}  # per run: [event, sink readers, next index]

    # -- writing ----------------------------------------------------------------------
    async def append(
        self, trace_id: str, kind: str, data: dict[str, Any] | None = None, *, step_id: str | None = None
    ) -> Event:
        """Store the event with the next seq, then publish it. Raises RunGone."""
        return (await self.append_many(trace_id, [(kind, data, step_id)]))[0]

    async def append_many(
        self, trace_id: str, items: list[tuple[str, dict[str, Any] | None, str | None]]
    ) -> list[Event]:
        """Store (kind, data, step_id) items as consecutive events in one statement, then
        publish them in order. Raises RunGone."""
        for kind, _, _ in items:
            if kind not in KINDS:
                raise ValueError(f"unknown event kind {kind!r}")
        lock = self._locks.setdefault(trace_id, asyncio.Lock())
        async with lock:
            for _ in range(20):
                last = self._last.get(trace_id)
                if last is None:
                    last = await self.max_seq(trace_id)
                now = utcnow()
                ts = iso(now)
                rows: list[dict[str, Any]] = []
                for offset, (kind, data, step_id) in enumerate(items, 1):
                    payload: dict[str, Any] = {"trace_id": trace_id, "seq": last + offset, "ts": ts}
                    if step_id is not None:
                        payload["step_id"] = step_id
                    payload.update(data or {})
                    rows.append({"run": trace_id, "seq": last + offset, "kind": kind,
                                 "data": payload, "created_at": now})
                try:
                    if len(rows) == 1:
                        await RunEvent.acreate(**rows[0])
                    else:
                        await self.db.aexecute(RunEvent.insert_many(rows))
                except IntegrityError:
                    # Another process appended (or the run is gone): re-read and retry.
                    self._last.pop(trace_id, None)
                    await self._check_open(trace_id)
                    continue
                self._last[trace_id] = last + len(rows)
                events = [Event(row["seq"], row["kind"], row["data"]) for row in rows]
                for event in events:
                    self.publish(event, trace_id)
                if events[-1].terminal:
                    self.forget(trace_id)
                return events
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
        sinks = []
        for sub in list(subs):
            if sub.sink is not None:
                sinks.append(sub)
                continue
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                sub.dropped = True
                subs.discard(sub)
        if sinks:
            jobs = self._fanout.get(trace_id)
            if jobs is None:
                jobs = self._fanout[trace_id] = deque()
                asyncio.get_running_loop().call_soon(self._fan_out, trace_id)
            jobs.append([event, sinks, 0])
            if len(jobs) == 1 and len(sinks) <= FANOUT_SLICE:
                self._fan_out(trace_id)  # small: write now (the scheduled call finds nothing)

    def _fan_out(self, trace_id: str) -> None:
        """Write queued events to sink readers, FANOUT_SLICE writes per loop turn, in order."""
        jobs = self._fanout.get(trace_id)
        if not jobs:
            self._fanout.pop(trace_id, None)
            return
        budget, now = FANOUT_SLICE, time.monotonic()
        subs = self._subs.get(trace_id)
        while jobs and budget > 0:
            job = jobs[0]
            event, sinks, index = job
            end = min(len(sinks), index + budget)
            for sub in sinks[index:end]:
                if sub.sink is not None and not sub.push(event, now) and subs is not None:
                    subs.discard(sub)
            budget -= end - index
            if end < len(sinks):
                job[2] = end
            else:
                jobs.popleft()
                if event.terminal:  # now let the readers' tasks end their responses
                    for sub in sinks:
                        sub.wake()
        if jobs:
            asyncio.get_running_loop().call_soon(self._fan_out, trace_id)
        else:
            self._fanout.pop(trace_id, None)

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
            await release_connection(self.db)
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

    def follow(
        self,
        trace_id: str,
        *,
        after: int = 0,
        is_live: Callable[[], bool] = lambda: True,
        ping_every: float = 15.0,
        poll_every: float = 0.2,
    ) -> Follow:
        """Every event after `after`, once and in order, ending with the terminal one.

        Yields `PING` (None) when `ping_every` seconds pass without an event. While
        `is_live()` is false (the run executes elsewhere) the store is polled. Set
        `.sink` on the result before iterating to have live events written by the sink.
        """
        return Follow(self, trace_id, after, is_live, ping_every, poll_every)

    async def _follow(
        self,
        follow: Follow,
        trace_id: str,
        after: int,
        is_live: Callable[[], bool],
        ping_every: float,
        poll_every: float,
    ) -> AsyncIterator[Event | None]:
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
                elif follow.sink is not None and not sub.dropped and is_live():
                    # Caught up: from here `publish` writes through the sink, no task wake-up.
                    sub.sink, sub.last, sub.written_at = follow.sink, last, next_ping - ping_every
                    sub.gap = False
                    try:
                        await self.release()
                        while sub.sink is not None:
                            wait = max(sub.written_at + ping_every - time.monotonic(), 0.0)
                            sub.waiter = asyncio.get_running_loop().create_future()
                            try:
                                async with asyncio.timeout(wait):
                                    await sub.waiter
                            except (asyncio.TimeoutError, TimeoutError):
                                pass
                            finally:
                                sub.waiter = None
                            if sub.sink is None:
                                break
                            if time.monotonic() >= sub.written_at + ping_every:
                                yield PING
                                sub.written_at = time.monotonic()
                            if not is_live():  # ended elsewhere, or handed over: read the store
                                break
                    finally:
                        sub.sink = None
                        last = sub.last
                        next_ping = sub.written_at + ping_every
                    if sub.ended:
                        return
                    catch_up = not sub.dropped
                    continue
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


class Follow:
    """What `EventLog.follow` returns: an async iterator of events and PINGs.

    `sink`, when set before the reader catches up, receives the live events instead
    (see `Subscription.push`); the iterator then yields only PINGs and ends after the
    sink took the terminal event.
    """

    def __init__(self, log: EventLog, trace_id: str, after: int, is_live: Callable[[], bool],
                 ping_every: float, poll_every: float) -> None:
        self.sink: Sink | None = None
        self._gen = log._follow(self, trace_id, after, is_live, ping_every, poll_every)

    def __aiter__(self) -> Follow:
        return self

    def __anext__(self) -> Awaitable[Event | None]:
        return self._gen.__anext__()

    async def aclose(self) -> None:
        await self._gen.aclose()


class RunWriter:
    """One live run's store writes (event appends, row updates), applied strictly in the
    order submitted by a task of their own.

    The run submits and goes on, so a step's writes overlap the next provider call; it
    waits only where it must (`await submit(...)`, `drain()`). The first failing write
    (RunGone, a store error) skips every later one; `check()` and `drain()` raise it.
    """

    def __init__(self) -> None:
        self._queue: deque[tuple[asyncio.Future, Callable[..., Awaitable], tuple, dict]] = deque()
        self._task: asyncio.Task | None = None
        self.error: BaseException | None = None

    def submit(self, fn: Callable[..., Awaitable], *args: Any, **kwargs: Any) -> asyncio.Future:
        """Queue `await fn(*args, **kwargs)`; the returned future has its result."""
        self.check()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append((future, fn, args, kwargs))
        if self._task is None or self._task.done():
            # A task per burst: pwasyncio gives its pooled connection back when it ends.
            self._task = loop.create_task(self._work())
        return future

    async def _work(self) -> None:
        while self._queue:
            future, fn, args, kwargs = self._queue.popleft()
            result = None
            if self.error is None:
                try:
                    result = await fn(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - handed to whoever checks next
                    self.error = exc
            if future.done():  # its waiter went away; the write happened all the same
                continue
            if self.error is not None:
                future.set_exception(self.error)
                future.exception()  # fire-and-forget writes: raised by check()/drain() instead
            else:
                future.set_result(result)

    def check(self) -> None:
        """Raise the error of a failed write, if any."""
        if self.error is not None:
            raise self.error

    async def settle(self) -> None:
        """Wait until every submitted write is done (stored or skipped); never raises."""
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def drain(self) -> None:
        """Wait until every submitted write is stored; raise the first write error."""
        await self.settle()
        self.check()


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
        await self._stop_timer()
        await self._flush()

    async def take(self) -> str:
        """Stop the timer and hand back the buffered text un-appended: the caller stores it
        together with the step's next event (one statement instead of two)."""
        await self._stop_timer()
        async with self._lock:
            text = "".join(self._buffer)
            self._buffer.clear()
        return text

    async def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            if self._sleeping_timer is timer:  # still sleeping: cancel it, we flush now
                timer.cancel()
            else:  # already flushing: let that append finish first, in order
                await asyncio.shield(timer)
        if self._error is not None:
            error, self._error = self._error, None
            raise error

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
