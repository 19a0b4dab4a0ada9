"""Provider limits held (SPEC §12): a model call waits here for room under its
provider's `requests_per_minute`, `tokens_per_minute` and `max_concurrency`.

Calls wait rather than fail, in the fair order of money/fair_queue.py. On SQLite (one
process) the slots live in memory. On PostgreSQL they are rows (`provider_slot`) that
every process decides on under one advisory lock per provider, in short transactions
(no connection is held while a call waits): a waiting call's heartbeat keeps its row,
a held call's lease ends it if its process dies. A call's tokens are an estimate while
it runs (the provider's recent average) and its reported usage once done; a done call
counts in the minute from its *end* (a provider counts the answer when it sends it, and
a call may start a little after its grant), so no call let through here meets a 429 for
tokens the gate thought gone. A call the provider refused (an HTTP error) counts none.

The end of a call is not a transaction of its own on PostgreSQL: it is stored by the
next transaction of this process's gate (another call's entry, or a waiting call's look),
or else, together with every other end of the moment, within a quarter of a second
(no longer than a waiting call of another process takes to look again).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
import uuid
from dataclasses import dataclass, field

from orchestra.db.provider_slot import ProviderSlot
from orchestra.money.fair_queue import WINDOW, Limits, Slot, decide

POLL = 0.25  # the longest a waiting call sleeps before it looks again (PostgreSQL)
HEARTBEAT_LIFE = 30.0  # a waiting row not refreshed this long belongs to a dead process
# Seconds an ended call waits for another transaction of this process to store its end
# (the next call's entry, a waiting call's look): no longer than a waiting call elsewhere
# takes to look again.
END_DELAY = POLL


@dataclass
class Pass:
    """A granted call: what `leave` needs."""

    provider_id: str
    slot: Slot


@dataclass
class _Provider:
    slots: list[Slot] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    average: float = 0.0  # reported tokens per call, smoothed (the next estimate)
    cool_until: float = 0.0  # a 429's Retry-After: nobody is let through before


class ProviderGate:
    """One per engine: `enter` (waits for room), `leave` (the call's reported tokens)."""

    def __init__(self, db, *, shared: bool, write_transaction, release, lease_seconds: float) -> None:
        self.db = db
        self.shared = shared  # PostgreSQL: the slots are rows every process sees
        self.write_transaction = write_transaction
        self.release = release
        self.lease_seconds = lease_seconds
        self._providers: dict[str, _Provider] = {}
        self._ended: dict[str, tuple[int, float]] = {}  # PostgreSQL: slot id → (tokens, end), not yet stored
        self._storing: asyncio.Task | None = None
        self._waiting: set[str] = set()  # PostgreSQL: this process's waiting slots
        self._granted: set[str] = set()  # ... of them, those a look here granted

    def _of(self, provider_id: str) -> _Provider:
        return self._providers.setdefault(provider_id, _Provider())

    def estimate(self, provider_id: str, fallback: int) -> int:
        average = self._of(provider_id).average
        return max(1, int(average)) if average else max(1, fallback)

    def cool_down(self, provider_id: str, seconds: float) -> None:
        """The provider answered 429: let no call of this process through meanwhile."""
        state = self._of(provider_id)
        state.cool_until = max(state.cool_until, time.time() + seconds)

    async def enter(self, provider_id: str, stored_limits: dict | None, run_id: str,
                    tokens: int, *, requested_at: float | None = None) -> Pass | None:
        """Wait for room; the call's pass (None: the provider has no limits).
        `requested_at`: when the call first asked (a call tried again after a 429 keeps
        its place in the fair order)."""
        limits = Limits.of(stored_limits)
        if limits is None:
            return None
        state = self._of(provider_id)
        if state.cool_until > time.time():
            await asyncio.sleep(state.cool_until - time.time())
        now = time.time()
        slot = Slot(str(uuid.uuid4()), run_id, tokens, "waiting", requested_at or now,
                    expires_at=now + HEARTBEAT_LIFE)
        if self.shared:
            return await self._enter_store(provider_id, limits, slot)
        return await self._enter_memory(provider_id, limits, slot, state)

    async def leave(self, ticket: Pass | None, tokens: int | None) -> None:
        """The call ended: `tokens` it used (None: unknown, its estimate counts; 0: the
        provider refused it)."""
        if ticket is None:
            return
        state = self._of(ticket.provider_id)
        if tokens:
            state.average = tokens if not state.average else 0.8 * state.average + 0.2 * tokens
        final = ticket.slot.tokens if tokens is None else tokens
        now = time.time()
        if not self.shared:
            ticket.slot.state, ticket.slot.tokens, ticket.slot.granted_at = "done", final, now
            self._poke(state)
            return
        self._ended[ticket.slot.id] = (final, now)
        if self._storing is None or self._storing.done():
            self._storing = asyncio.get_running_loop().create_task(self._store_ended_soon())
        self._poke(state)  # this process's waiting calls look again: their look stores it

    async def close(self) -> None:
        """The engine stops: the ends not stored yet, now (else their leases end them)."""
        with contextlib.suppress(Exception):
            await self._store_ended()
            await self.release()

    async def _store_ended_soon(self) -> None:
        """Store the ends no other transaction carried, all in one statement."""
        await asyncio.sleep(END_DELAY)
        with contextlib.suppress(Exception):  # a held row's lease ends it anyway
            await self._store_ended()
            await self.release()

    async def _store_ended(self) -> dict[str, tuple[int, float]]:
        """The calls ended here and not stored yet: `done`, with their tokens, counted from
        their end (inside the caller's transaction, if any); what it stored."""
        if not self._ended:
            return {}
        ended, self._ended = self._ended, {}
        try:
            values = ", ".join(["(%s, %s::integer, %s::float8)"] * len(ended))
            await self.db.aexecute_sql(
                'UPDATE "provider_slot" AS s SET "state" = \'done\', "tokens" = v.tokens, '
                f'"granted_at" = v.ended FROM (VALUES {values}) AS v(id, tokens, ended) '
                'WHERE s."id" = v.id',
                tuple(x for slot_id, (tokens, at) in ended.items() for x in (slot_id, tokens, at)))
        except BaseException:
            self._ended = ended | self._ended
            raise
        return ended

    @staticmethod
    def _poke(state: _Provider) -> None:
        state.changed.set()
        state.changed = asyncio.Event()

    # -- one process (SQLite) --------------------------------------------------------
    async def _enter_memory(self, provider_id: str, limits: Limits, slot: Slot,
                            state: _Provider) -> Pass:
        state.slots.append(slot)
        await self.release()  # no store connection held while waiting
        try:
            while True:
                now = time.time()
                state.slots = [s for s in state.slots
                               if s.state != "done" or (s.granted_at or 0) > now - WINDOW]
                granted, wake = decide(state.slots, limits, now)
                for chosen in granted:
                    chosen.state, chosen.granted_at, chosen.expires_at = "held", now, float("inf")
                if granted:
                    self._poke(state)
                if slot.state == "held":
                    return Pass(provider_id, slot)
                changed = state.changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), None if wake is None else max(0.0, wake - now))
        except BaseException:
            if slot.state == "waiting":
                state.slots.remove(slot)
            else:
                slot.state = "done"
            self._poke(state)
            raise

    # -- every process (PostgreSQL) ---------------------------------------------------
    async def _enter_store(self, provider_id: str, limits: Limits, slot: Slot) -> Pass:
        key = int.from_bytes(hashlib.sha256(provider_id.encode()).digest()[:8], "big", signed=True)
        state = self._of(provider_id)
        first = True
        self._waiting.add(slot.id)
        try:
            while True:
                if slot.id in self._granted:  # granted by another call's look here: no look of its own
                    self._granted.discard(slot.id)
                    slot.state = "held"
                    return Pass(provider_id, slot)
                carried: dict[str, tuple[int, float]] = {}
                try:
                    granted, slots, wake, now = await self._look(
                        key, provider_id, limits, slot, first, carried)
                except BaseException:
                    self._ended = carried | self._ended  # not stored: the next one carries them
                    raise
                first = False
                mine = any(s.id == slot.id for s in granted) or any(
                    s.id == slot.id and s.state == "held" for s in slots)
                others = {s.id for s in granted if s.id != slot.id} & self._waiting
                if others:  # this process's calls granted by this look: they go at once
                    self._granted |= others
                    self._poke(state)
                await self.release()
                if mine:
                    slot.state = "held"
                    return Pass(provider_id, slot)
                pause = POLL if wake is None else min(POLL * 4, max(0.01, wake - now))
                changed = state.changed  # a call of this process ending wakes its waiters at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), pause * random.uniform(0.6, 1.0))
        except BaseException:
            if not first:
                with contextlib.suppress(Exception):  # its heartbeat or lease ends it anyway
                    await asyncio.shield(self._drop(slot.id))
            raise
        finally:
            self._waiting.discard(slot.id)
            self._granted.discard(slot.id)

    async def _look(self, key: int, provider_id: str, limits: Limits, slot: Slot, first: bool,
                    carried: dict[str, tuple[int, float]]) -> tuple[list[Slot], list[Slot], float | None, float]:
        """One decision under the provider's advisory lock, in one transaction: the ends
        of this process's calls stored first (`carried` learns them), this call's row
        inserted or refreshed, the dead rows dropped, the waiting calls that fit granted.
        (granted, every slot, when room may come next, now)."""
        async with self.write_transaction():
            await self.db.aexecute_sql("SELECT pg_advisory_xact_lock(%s)", (key,))
            carried.update(await self._store_ended())
            now = time.time()
            if first:
                await self.db.aexecute(ProviderSlot.insert(
                    id=slot.id, provider_id=provider_id, run_id=slot.run_id, tokens=slot.tokens,
                    state="waiting", requested_at=slot.requested_at, expires_at=now + HEARTBEAT_LIFE))
            elif not await self.db.aexecute(ProviderSlot.update(expires_at=now + HEARTBEAT_LIFE).where(
                    (ProviderSlot.id == slot.id) & (ProviderSlot.state == "waiting"))):
                # not waiting any more: granted meanwhile (the insert is ignored), or
                # taken for dead after a long stall — then it queues again, in its place
                await self.db.aexecute(ProviderSlot.insert(
                    id=slot.id, provider_id=provider_id, run_id=slot.run_id, tokens=slot.tokens,
                    state="waiting", requested_at=slot.requested_at,
                    expires_at=now + HEARTBEAT_LIFE).on_conflict_ignore())
            await self.db.aexecute(ProviderSlot.delete().where(
                (ProviderSlot.provider_id == provider_id) & (
                    ((ProviderSlot.state == "waiting") & (ProviderSlot.expires_at < now))
                    | ((ProviderSlot.state != "waiting") & (ProviderSlot.granted_at < now - WINDOW)))))
            rows = await self.db.list(ProviderSlot.select().where(
                ProviderSlot.provider_id == provider_id))
            slots = [Slot(r.id, r.run_id, r.tokens, r.state, r.requested_at, r.granted_at,
                          r.expires_at) for r in rows]
            granted, wake = decide(slots, limits, now)
            if granted:
                await self.db.aexecute(ProviderSlot.update(
                    state="held", granted_at=now, expires_at=now + self.lease_seconds,
                ).where(ProviderSlot.id.in_([s.id for s in granted])))
        return granted, slots, wake, now

    async def _drop(self, slot_id: str) -> None:
        await self.db.aexecute(ProviderSlot.update(state="done").where(
            (ProviderSlot.id == slot_id) & (ProviderSlot.state == "held")))
        await self.db.aexecute(ProviderSlot.delete().where(
            (ProviderSlot.id == slot_id) & (ProviderSlot.state == "waiting")))
        await self.release()
