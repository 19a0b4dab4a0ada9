"""The run event log in the store: append with the next per-run `seq`, read in pages.

Events are stored before anyone sees them. Any process may append to a run (its owner,
or the process that took a reply); the unique `(run, seq)` index makes a concurrent
append fail, and the loser re-reads the last seq and tries again. Whoever stores events
hands them to `on_stored` callbacks (this process's live feed); other processes learn
of them from the store's `events` signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from peewee import IntegrityError, fn

from orchestra.backoff import Backoff
from orchestra.db.database import release_connection
from orchestra.db.models import RunEvent, WorkflowRun, iso, utcnow
from orchestra.engine.model import At, Question
from orchestra.timestamps import parse_ts
from orchestra.vocabulary import KINDS, TERMINAL, EventKind

APPEND_DEADLINE_SECONDS = 30.0  # how long appends retry through seq conflicts
SEQ_RACE = Backoff(base=0.005, cap=0.2)  # the wait before writing again after losing a seq race
PAGE_EVENTS = 256  # a catch-up page holds at most this many events ...
PAGE_BYTES = 256 * 1024  # ... and about this many bytes of event data (at least one event)
INSERT_CHUNK = 500  # events of several runs stored by one INSERT at most


class RunGone(Exception):
    """The run was deleted, or already has its terminal event: nothing more may be appended."""


class Fenced(RunGone):
    """The writer no longer holds the run's claim (another process took it over): the
    store refused the write, and the writer's task must stop without writing more."""


class StoreContention(Exception):
    """Appends kept colliding with other writers' for longer than the deadline."""


class SeqRetry:
    """The one policy for a write that lost a seq race (another writer stored the same
    `(run, seq)` first): try again after a short doubling backoff with jitter, until
    APPEND_DEADLINE_SECONDS have passed, then StoreContention. Plain appends and the
    store's row-and-event transactions (`RunStore.write`) both use it. The writer's
    connection goes back to the pool before the wait (the failed transaction is over)."""

    __slots__ = ("_db", "_deadline", "_loop", "_tries")

    def __init__(self, db) -> None:
        self._db = db
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + APPEND_DEADLINE_SECONDS
        self._tries = 0

    async def again(self, trace_id: str) -> None:
        """Wait before the next try, or raise StoreContention past the deadline."""
        if self._loop.time() > self._deadline:
            raise StoreContention(f"could not write to run {trace_id}: other writers kept winning")
        self._tries += 1
        await release_connection(self._db)
        await SEQ_RACE.sleep(self._tries)


class Event:
    """One stored event. `data` is parsed on demand from the stored JSON text, and
    `frame()`, its SSE text, is built once and shared by every local subscriber."""

    __slots__ = ("_data", "_frame", "_raw", "kind", "seq")

    def __init__(self, seq: int, kind: str, data: dict[str, Any] | None = None, *,
                 raw: str | None = None) -> None:
        self.seq = seq
        self.kind = kind
        self._data = data
        self._raw = raw
        self._frame: bytes | None = None

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            if self._raw is None and self._frame is not None:  # the frame holds the text
                self._raw = self._frame.split(b"\ndata: ", 1)[1][:-2].decode()
            self._data = json.loads(self._raw or "{}")
        return self._data

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL

    def frame(self) -> bytes:
        """`id:`/`event:`/`data:` lines; JSON text never holds a raw newline."""
        if self._frame is None:
            payload = self._raw
            if payload is None:
                payload = json.dumps(self._data, ensure_ascii=False, separators=(",", ":"))
            self._frame = f"id: {self.seq}\nevent: {self.kind}\ndata: {payload}\n\n".encode()
            self._raw = None  # one copy of a large text is enough: the frame holds it
        return self._frame

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "data": self.data}

    def __repr__(self) -> str:
        return f"Event({self.seq}, {self.kind!r})"


Stored = Callable[[str, list[Event]], None]
#: (kind, data, step): an event to store; `step` is an instance (`At`), a step id, or None.
Item = tuple[str, dict[str, Any] | None, "At | str | None"]


class Outbox(Protocol):
    """What queues deliveries of run events (services/outbox.py): `queue` runs inside the
    transaction that stores `events`, for inserts holding a kind in `kinds`."""

    kinds: frozenset[str]

    async def queue(self, trace_id: str, events: list[Event]) -> None: ...


class EventLog:
    """Appends and reads of `run_event`; one per process."""

    def __init__(self, db: Any, *,
                 fence_for: Callable[[str], Callable[[], Awaitable[None]] | None] | None = None,
                 outbox: Outbox | None = None) -> None:
        self.db = db
        self.on_stored: list[Stored] = []
        # The fence of an append (a run owner's check of its claim), by run: the run store's.
        self.fence_for = fence_for
        self._locks: dict[str, asyncio.Lock] = {}
        self._last: dict[str, int] = {}
        # The outbox (SPEC §11): given the events an insert stores, in the same
        # transaction, so that a subscriber's delivery is queued with its event or not at all.
        self.outbox = outbox

    # -- writing ----------------------------------------------------------------------
    async def append(
        self, trace_id: str, kind: str, data: dict[str, Any] | None = None, *,
        step_id: At | str | None = None,
    ) -> Event:
        """Store the event with the next seq, then publish it. Raises RunGone."""
        return (await self.append_many(trace_id, [(kind, data, step_id)]))[0]

    async def append_many(
        self, trace_id: str, items: list[Item], *,
        fence: Callable[[], Awaitable[None]] | None = None,
    ) -> list[Event]:
        """Store (kind, data, step_id) items as consecutive events in one statement, then
        publish them in order. Raises RunGone, or StoreContention after the deadline.
        With `fence` (a run owner's write), the insert runs in one transaction after
        `fence()`, which checks the claim and raises Fenced when it no longer holds."""
        if fence is None and self.fence_for is not None:
            fence = self.fence_for(trace_id)
        lock = self._locks.setdefault(trace_id, asyncio.Lock())
        retry = SeqRetry(self.db)
        async with lock:
            while True:
                try:
                    if fence is None:
                        events = await self.insert(trace_id, items, last=self._last.get(trace_id))
                    else:
                        async with self.db.atomic():
                            await fence()
                            events = await self.insert(trace_id, items,
                                                       last=self._last.get(trace_id))
                except IntegrityError:
                    # Another process appended (or the run is gone): re-read and retry.
                    self._last.pop(trace_id, None)
                    await self._check_open(trace_id)
                    await retry.again(trace_id)
                    continue
                self._last[trace_id] = events[-1].seq
                break
        if events[-1].terminal:
            self.forget(trace_id)
        self.published(trace_id, events)
        return events

    async def insert(
        self, trace_id: str, items: list[Item], *,
        last: int | None = None,
    ) -> list[Event]:
        """One try at storing items after `last` (by default the last seq this process
        stored, else read from the store), in one statement: IntegrityError when another
        writer took one of those seqs (the caller forgets the cached seq and tries again;
        a cached seq is never ahead of the store, so a stale one can only collide, never
        leave a gap). Publishes nothing: inside a caller's transaction, the caller calls
        `remember` and `published` after the commit."""
        for kind, _, _ in items:
            if kind not in KINDS:
                raise ValueError(f"unknown event kind {kind!r}")
        if last is None:
            last = self._last.get(trace_id)
        if last is None:
            last = await self.max_seq(trace_id)
        rows = self._rows(trace_id, last, items)
        outbox = self.outbox
        if outbox is not None and any(row["kind"] in outbox.kinds for row in rows):
            async with self.db.atomic():  # the event and its deliveries commit together
                events = await self._store(rows)
                await outbox.queue(trace_id, events)
            return events
        return await self._store(rows)

    async def insert_first(self, items: dict[str, list[Item]]) -> dict[str, list[Event]]:
        """The first events of several runs (none stored yet), in one statement inside
        the caller's transaction (IntegrityError when a run had one after all). Publishes
        nothing, like `insert`."""
        rows = {trace_id: self._rows(trace_id, 0, run_items) for trace_id, run_items in items.items()}
        every = [row for run_rows in rows.values() for row in run_rows]
        for row in every:
            if row["kind"] not in KINDS:
                raise ValueError(f"unknown event kind {row['kind']!r}")
        for at in range(0, len(every), INSERT_CHUNK):
            await self.db.aexecute(RunEvent.insert_many(every[at:at + INSERT_CHUNK]))
        events = {trace_id: [Event(row["seq"], row["kind"], row["data"]) for row in run_rows]
                  for trace_id, run_rows in rows.items()}
        outbox = self.outbox
        if outbox is not None:
            for trace_id, run_events in events.items():
                if any(event.kind in outbox.kinds for event in run_events):
                    await outbox.queue(trace_id, run_events)
        return events

    async def _store(self, rows: list[dict[str, Any]]) -> list[Event]:
        if len(rows) == 1:
            await RunEvent.acreate(**rows[0])
        else:
            await self.db.aexecute(RunEvent.insert_many(rows))
        return [Event(row["seq"], row["kind"], row["data"]) for row in rows]

    def remember_none(self, trace_id: str) -> None:
        """A run this process just stored: it has no events yet (a stale guess could only
        collide and be read again, never leave a gap)."""
        self._last.setdefault(trace_id, 0)

    def remember(self, trace_id: str, events: list[Event]) -> None:
        """After a commit: `events` are stored, the next append follows the last of them."""
        if not events:
            return
        if events[-1].terminal:
            self.forget(trace_id)
        else:
            self._last[trace_id] = events[-1].seq

    def published(self, trace_id: str, events: list[Event]) -> None:
        """Hand events just stored (by this process) to the `on_stored` callbacks."""
        for callback in self.on_stored:
            callback(trace_id, events)

    @staticmethod
    def _rows(trace_id: str, last: int, items) -> list[dict[str, Any]]:
        now = utcnow()
        ts = iso(now)
        rows: list[dict[str, Any]] = []
        for offset, (kind, data, step_id) in enumerate(items, 1):
            payload: dict[str, Any] = {"trace_id": trace_id, "seq": last + offset, "ts": ts}
            if step_id is not None:  # every step event names its instance (SPEC §8)
                payload["step_id"] = str(step_id)
                payload["path"] = step_id.path if isinstance(step_id, At) else step_id
            payload.update(data or {})
            rows.append({"run": trace_id, "seq": last + offset, "kind": kind,
                         "data": payload, "created_at": now})
        return rows

    async def _check_open(self, trace_id: str) -> None:
        if await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id) is None:
            raise RunGone(f"run {trace_id} no longer exists")
        last = await self.last_event(trace_id)
        if last is not None and last.terminal:
            raise RunGone(f"run {trace_id} has already ended")

    def forget(self, trace_id: str) -> None:
        """Drop the cached seq and lock of a run (ended, or no longer held here)."""
        self._last.pop(trace_id, None)
        lock = self._locks.get(trace_id)
        if lock is not None and not lock.locked():
            self._locks.pop(trace_id, None)

    async def release(self) -> None:
        """Give the current task's pooled connection back before a wait.

        pwasyncio binds a connection to each task until the task ends; a stream or a
        run that waits must not hold one, or a few of them drain the pool."""
        with contextlib.suppress(Exception):  # releasing is best effort
            await release_connection(self.db)

    # -- reading ----------------------------------------------------------------------
    async def max_seq(self, trace_id: str) -> int:
        rows = await self.db.list(
            RunEvent.select(fn.MAX(RunEvent.seq).alias("m")).where(RunEvent.run == trace_id).dicts()
        )
        return int(rows[0]["m"] or 0) if rows else 0

    async def stored(
        self, trace_id: str, *, after: int = 0, upto: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """Events with `after < seq <= upto`, in order, at most `limit` (the JSON text left
        unparsed)."""
        raw = fn.COALESCE(RunEvent.data, "").coerce(False).alias("raw")
        query = RunEvent.select(RunEvent.seq, RunEvent.kind, raw).where(
            (RunEvent.run == trace_id) & (RunEvent.seq > after)
        )
        if upto is not None:
            query = query.where(RunEvent.seq <= upto)
        query = query.order_by(RunEvent.seq)
        if limit is not None:
            query = query.limit(limit)
        return [Event(seq, kind, raw=text) for seq, kind, text in await self.db.list(query.tuples())]

    async def page(self, trace_id: str, *, after: int) -> list[Event]:
        """The next events after `after`, at most PAGE_EVENTS and about PAGE_BYTES of data
        (at least one event): what a stream catching up holds in memory at once."""
        sizes = await self.db.list(
            RunEvent.select(RunEvent.seq, fn.LENGTH(RunEvent.data))
            .where((RunEvent.run == trace_id) & (RunEvent.seq > after))
            .order_by(RunEvent.seq)
            .limit(PAGE_EVENTS)
            .tuples()
        )
        if not sizes:
            return []
        total, upto = 0, sizes[0][0]
        for seq, size in sizes:
            total += int(size or 0)
            if total > PAGE_BYTES and seq != sizes[0][0]:
                break
            upto = seq
        return await self.stored(trace_id, after=after, upto=upto)

    async def last_event(self, trace_id: str) -> Event | None:
        events = await self.db.list(
            RunEvent.select(RunEvent.seq, RunEvent.kind, RunEvent.data)
            .where(RunEvent.run == trace_id)
            .order_by(RunEvent.seq.desc())
            .limit(1)
        )
        return Event(events[0].seq, events[0].kind, events[0].data) if events else None

    async def questions(self, trace_id: str) -> list[Question]:
        """Every question of a run, oldest first, with its answer where one is stored."""
        rows = await self.db.list(
            RunEvent.select(RunEvent.kind, RunEvent.data)
            .where((RunEvent.run == trace_id)
                   & RunEvent.kind.in_([EventKind.REPLY_REQUESTED, EventKind.REPLY_RECEIVED,
                                        EventKind.REPLY_TIMED_OUT, EventKind.REPLY_WITHDRAWN]))
            .order_by(RunEvent.seq)
        )
        asked: dict[str, Question] = {}
        for row in rows:
            if row.data.get("child_trace_id"):  # a child run's question, shown here (SPEC §14)
                continue
            request_id = row.data.get("request_id")
            if row.kind == EventKind.REPLY_REQUESTED:
                asked[request_id] = Question(request_id, row.data.get("step_id"),
                                             row.data.get("prompt"), path=row.data.get("path") or "",
                                             asked_at=parse_ts(row.data.get("ts")))
            elif row.kind == EventKind.REPLY_WITHDRAWN:
                asked.pop(request_id, None)  # asked by an earlier attempt, and not again
            elif request_id in asked and not asked[request_id].answered:
                asked[request_id].answered = True
                asked[request_id].answer = row.data.get("content", "")
        return list(asked.values())
