"""This process's live fan-out of run events to its stream readers.

A run's events reach a process's `Feed` either from its own appends (`EventLog.on_stored`)
or from the store's `events` signal, on which the feed reads the new events *once* for
all of its local readers: store load does not grow with the number of readers, and no
reader polls. A feed delivers in seq order; when it sees a gap it reads the store first.

A reader (`follow`) catches up from the store in bounded pages, holding no pooled
connection while it writes to its client, then joins the feed. Once caught up, a reader
may hand the feed a *sink* (a non-blocking socket write): the feed then writes each event
straight to every caught-up reader, one shared frame, no task wake-up per reader, in
slices of FANOUT_SLICE writes per loop turn. A reader that falls behind (its sink refuses,
or its queue passes its bounds) leaves the live path and catches up from the store at its
own pace, so a reader that never reads costs at most a page and a socket buffer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from orchestra.db.outage import STORE_RETRY, is_unreachable
from orchestra.engine.store.events import Event, EventLog

logger = logging.getLogger("orchestra.engine")

QUEUE_EVENTS = 256  # events a reader may have waiting before it must catch up from the store
QUEUE_BYTES = 1024 * 1024  # ... and bytes of frames
FANOUT_SLICE = 100  # socket writes per loop turn: timers and reads run between slices
EVERYTHING = 1 << 62  # "read whatever the store has"
PING = None  # what `follow` yields when a keep-alive comment is due

Sink = Callable[[Event], bool]  # writes an event now; False when the reader cannot keep up


class Subscription:
    """One reader's place in a feed: the last seq it has, and either a bounded queue or
    (caught up) a sink."""

    __slots__ = (
        "behind",
        "ended",
        "last",
        "queue",
        "queued_bytes",
        "sink",
        "trace_id",
        "waiter",
        "written_at",
    )

    def __init__(self, trace_id: str, last: int) -> None:
        self.trace_id = trace_id
        self.last = last
        self.queue: deque[Event] = deque()
        self.queued_bytes = 0
        self.behind = False  # missed events: read the store before taking the queue again
        self.sink: Sink | None = None
        self.ended = False  # the terminal event went through the sink
        self.written_at = 0.0
        self.waiter: asyncio.Future | None = None

    def offer(self, event: Event, now: float) -> None:
        """Take the feed's next event: write it through the sink, or queue it."""
        if event.seq <= self.last:
            return
        if self.sink is not None:
            if event.seq == self.last + 1 and self.sink(event):
                self.last, self.written_at = event.seq, now
                if event.terminal:  # the feed wakes the reader once every reader has it
                    self.sink, self.ended = None, True
                return
            self.sink = None  # a gap or a refusal: the reader goes on from its own task
            self.wake()
        if self.behind:
            return
        size = len(event.frame())
        if len(self.queue) >= QUEUE_EVENTS or self.queued_bytes + size > QUEUE_BYTES:
            self.queue.clear()
            self.queued_bytes, self.behind = 0, True
        else:
            self.queue.append(event)
            self.queued_bytes += size
        self.wake()

    def take(self) -> Event | None:
        if not self.queue:
            return None
        event = self.queue.popleft()
        self.queued_bytes -= len(event.frame())
        return event

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Feed:
    """One run's live events in this process, in order, for its local readers."""

    def __init__(self, feeds: Feeds, trace_id: str, last: int) -> None:
        self.feeds = feeds
        self.trace_id = trace_id
        self.last = last  # the highest seq delivered (or known to be stored) here
        self.subs: set[Subscription] = set()
        self._jobs: deque[list] = deque()  # [event, sink readers, next index]
        self._scheduled = False
        self._reading: asyncio.Task | None = None
        self._wanted = 0  # the highest seq signalled but not yet read
        self._asked = 0  # grows with every `want`: a read that began earlier may miss it

    def deliver(self, events: list[Event]) -> None:
        """Events just stored (here, or read after a signal), ascending."""
        for event in events:
            if event.seq <= self.last:
                continue
            if event.seq != self.last + 1:  # something in between was stored elsewhere
                self.want(event.seq)
                return
            self._publish(event)

    def want(self, seq: int) -> None:
        """The store holds events up to `seq`: read the ones not delivered yet, once."""
        if seq <= self.last:
            return
        self._wanted = max(self._wanted, seq)
        self._asked += 1
        if self._reading is None or self._reading.done():
            self._reading = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        log = self.feeds.log
        try:
            while self._wanted > self.last and self.subs:
                asked = self._asked
                events = await log.page(self.trace_id, after=self.last)
                await log.release()
                if not events:
                    if asked == self._asked:  # no signal came during the read: all is read
                        self._wanted = self.last
                        break
                    continue  # a signal came while the read ran: it may not have seen that event
                for event in events:
                    if event.seq == self.last + 1:
                        self._publish(event)
        except Exception as exc:
            if is_unreachable(exc):  # an outage: reported once by whoever tracks it
                logger.debug("feed of run %s: the store is unreachable", self.trace_id)
            else:
                logger.exception("feed of run %s could not read the store", self.trace_id)
            for sub in list(self.subs):
                sub.behind = True
                sub.sink = None
                sub.wake()

    def _publish(self, event: Event) -> None:
        self.last = event.seq
        sinks = []
        now = time.monotonic()
        for sub in list(self.subs):
            if sub.sink is not None:  # written by the fan-out, in order after earlier jobs
                sinks.append(sub)
            else:
                sub.offer(event, now)
        if sinks:
            self._jobs.append([event, sinks, 0])
            if len(self._jobs) == 1 and len(sinks) <= FANOUT_SLICE:
                self._fan_out()  # small: write now
            elif not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._fan_out)

    def _fan_out(self) -> None:
        """Write queued events to sink readers, FANOUT_SLICE writes per loop turn, in order."""
        self._scheduled = False
        budget, now = FANOUT_SLICE, time.monotonic()
        jobs = self._jobs
        while jobs and budget > 0:
            job = jobs[0]
            event, sinks, index = job
            end = min(len(sinks), index + budget)
            for sub in sinks[index:end]:
                sub.offer(event, now)
            budget -= end - index
            if end < len(sinks):
                job[2] = end
            else:
                jobs.popleft()
                if event.terminal:  # now let the readers' tasks end their responses
                    for sub in sinks:
                        sub.wake()
        if jobs and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._fan_out)


class Feeds:
    """Every run feed of this process; fed by local appends and by `events` signals."""

    def __init__(self, log: EventLog, signals: Any = None) -> None:
        self.log = log
        self._feeds: dict[str, Feed] = {}
        log.on_stored.append(self._stored)
        if signals is not None:
            signals.on("events", self._signalled)
            signals.on_resync(self._resync)

    def _stored(self, trace_id: str, events: list[Event]) -> None:
        feed = self._feeds.get(trace_id)
        if feed is not None:
            feed.deliver(events)

    def _signalled(self, payload: str) -> None:
        trace_id, _, seq = payload.rpartition(":")
        feed = self._feeds.get(trace_id)
        if feed is not None and seq.isdigit():
            feed.want(int(seq))

    def _resync(self) -> None:
        """Signals may have been missed: every feed reads what the store has."""
        for feed in self._feeds.values():
            feed.want(EVERYTHING)

    def join(self, trace_id: str, last: int) -> Subscription:
        feed = self._feeds.get(trace_id)
        if feed is None:
            feed = self._feeds[trace_id] = Feed(self, trace_id, last)
        sub = Subscription(trace_id, last)
        feed.subs.add(sub)
        if feed.last > last:  # stored since the reader's own read: it reads those first
            sub.behind = True
        else:  # whatever was stored (anywhere) since, the feed reads once
            feed.want(EVERYTHING)
        return sub

    def leave(self, sub: Subscription) -> None:
        feed = self._feeds.get(sub.trace_id)
        if feed is not None:
            feed.subs.discard(sub)
            if not feed.subs:
                self._feeds.pop(sub.trace_id, None)

    def subscriber_count(self, trace_id: str) -> int:
        feed = self._feeds.get(trace_id)
        return len(feed.subs) if feed else 0

    def follow(self, trace_id: str, *, after: int = 0, ping_every: float = 15.0) -> Follow:
        """Every event after `after`, once and in order, ending with the terminal one;
        PING (None) when `ping_every` seconds pass without one."""
        return Follow(self, trace_id, after, ping_every)

    async def _follow(self, follow: Follow, trace_id: str, after: int,
                      ping_every: float) -> AsyncIterator[Event | None]:
        cursor = _Cursor(after, ping_every)
        while True:
            async for item in self._catch_up(trace_id, cursor):
                yield item
                if item is not PING and item.terminal:
                    return
            sub = self.join(trace_id, cursor.last)
            try:
                async for item in self._live(follow, sub, ping_every, cursor.next_ping):
                    if item is PING:
                        yield PING
                        continue
                    yield item
                    if item.terminal:
                        return
                if sub.ended:
                    return
            finally:
                self.leave(sub)
                cursor.last = sub.last
                cursor.pinged()

    async def _catch_up(self, trace_id: str, cursor: _Cursor) -> AsyncIterator[Event | None]:
        """Stored events after `cursor.last`, a bounded page at a time, holding no
        connection while a page is written to the client; up to the terminal event or
        the last stored one. While the store is away: pings, and the catch-up goes on
        once it is back."""
        log, retry = self.log, 0
        while True:
            try:
                page = await log.page(trace_id, after=cursor.last)
                await log.release()
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                retry += 1
                await _release_quietly(log)
                await asyncio.sleep(min(STORE_RETRY.delay(retry), max(cursor.next_ping - time.monotonic(), 0.0)))
                if time.monotonic() >= cursor.next_ping:
                    yield PING
                    cursor.pinged()
                continue
            retry = 0
            if not page:
                return
            page.reverse()
            while page:
                event = page.pop()
                yield event
                cursor.last = event.seq
                cursor.pinged()
                if event.terminal:
                    return

    async def _live(self, follow: Follow, sub: Subscription, ping_every: float,
                    next_ping: float) -> AsyncIterator[Event | None]:
        """Events from the feed until the reader falls behind (then the caller catches
        up from the store) or the terminal event has gone out."""
        await self.log.release()
        loop = asyncio.get_running_loop()
        sub.written_at = next_ping - ping_every
        while not sub.behind:
            event = sub.take()
            if event is not None:
                if event.seq <= sub.last:
                    continue
                if event.seq != sub.last + 1:
                    sub.behind = True
                    break
                sub.last = event.seq
                sub.written_at = time.monotonic()
                yield event
                if event.terminal:
                    return
                continue
            if sub.ended:
                return
            if follow.sink is not None and sub.sink is None and not sub.queue:
                sub.sink = follow.sink  # caught up: the feed writes for us from now on
            wait = max(sub.written_at + ping_every - time.monotonic(), 0.0)
            sub.waiter = loop.create_future()
            try:
                async with asyncio.timeout(wait):
                    await sub.waiter
            except TimeoutError:
                pass
            finally:
                sub.waiter = None
            if time.monotonic() >= sub.written_at + ping_every and not sub.queue:
                yield PING
                sub.written_at = time.monotonic()
        sub.sink = None


async def _release_quietly(log: EventLog) -> None:
    try:
        await log.release()
    except Exception:  # noqa: BLE001 - the connection is gone with the store
        logger.debug("could not release a store connection", exc_info=True)


class _Cursor:
    """Where a follower is: the last seq it was given, and when its next ping is due."""

    __slots__ = ("every", "last", "next_ping")

    def __init__(self, last: int, every: float) -> None:
        self.last = last
        self.every = every
        self.next_ping = time.monotonic() + every

    def pinged(self) -> None:
        """Something was sent: the next ping is due a whole interval from now."""
        self.next_ping = time.monotonic() + self.every


class Follow:
    """What `Feeds.follow` returns: an async iterator of events and PINGs. `sink`, when
    set before iterating, receives the live events once the reader has caught up."""

    def __init__(self, feeds: Feeds, trace_id: str, after: int, ping_every: float) -> None:
        self.sink: Sink | None = None
        self._gen = feeds._follow(self, trace_id, after, ping_every)

    def __aiter__(self) -> Follow:
        return self

    def __anext__(self) -> Awaitable[Event | None]:
        return self._gen.__anext__()

    async def aclose(self) -> None:
        await self._gen.aclose()
