"""Who holds a run: atomic claims, lease renewal and hand-back, in the store.

A run row names its owner (`owner_process`) and the time its lease ends (`lease_until`,
epoch seconds; hosts keep their clocks in sync, as with any lease). A claim is one
conditional `UPDATE … WHERE status is active AND (no lease OR lease ended)`: the store
lets exactly one claimer change the row, whatever the number of processes. The owner
renews all of its leases in one statement; a run it no longer holds (its lease ran out
while the process stalled, and another process took it) is dropped here at once.

Fencing: each claim writes a token of its own into `owner_process` (this process's
identity and a claim number, `host:pid:random#n`). Every write the owner makes is
conditioned on that token (`holds`), so a process that lost the claim — paused, cut
off, starved — is refused by the store, even if it claimed the same run again since.

Attempts count crashes: a claim adds one to `attempts` only when the run had an owner
whose lease ran out (the owner died). A queued run's first claim makes it 1; a run
handed back (its owner cleared) keeps its count; and the caller says when a claim is
not an attempt although a lease ran out (the store was unreachable meanwhile).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from peewee import SQL, Case, fn

from orchestra.db.models import WorkflowRun
from orchestra.vocabulary import ACTIVE


def process_identity() -> str:
    """host:pid:random — unique per process start, readable in the store."""
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Ownership:
    def __init__(self, db: Any, *, me: str, lease_seconds: float,
                 locked: Callable[[Any], Any] = lambda query: query) -> None:
        self.db = db
        self.me = me
        self.lease_seconds = lease_seconds
        self._numbers = itertools.count(1)
        # `query` locking its rows (PostgreSQL: FOR UPDATE): the run store's dialect's
        self.locked = locked

    def new_token(self) -> str:
        """A claim token of this process: its identity and the next claim number."""
        return f"{self.me}#{next(self._numbers)}"

    def claimed_columns(self) -> dict[str, Any]:
        """A new run's columns when this process stores it claimed (its first claim, made
        in the write that stores it)."""
        return {"owner_process": self.new_token(), "lease_until": time.time() + self.lease_seconds, "attempts": 1}

    @staticmethod
    def holds(trace_id: str, token: str):
        """The condition that the claim `token` still holds the run (for fenced writes)."""
        return (WorkflowRun.trace_id == trace_id) & (WorkflowRun.owner_process == token)

    def _claimable(self, now: float):
        return WorkflowRun.status.in_(list(ACTIVE)) & (
            WorkflowRun.lease_until.is_null() | (WorkflowRun.lease_until < now)
        )

    async def candidates(self, limit: int, *, per_user: int = 0,
                         busy: dict[str, int] | None = None) -> list[tuple[str, str]]:
        """Runs nobody holds (queued, or their owner's lease ran out) as `(trace_id,
        owner_id)`, fairly across owners (SPEC §15b): each owner's runs oldest first, taken
        in turns — every owner's first, then every owner's second, … — so one owner's
        backlog delays another's run by one claim round at most. `per_user` (0: none): an
        owner's runs this process may hold at once, `busy` those it holds already (an
        owner at the cap has no candidate, one below it only what fits)."""
        if limit <= 0:
            return []
        turn = fn.ROW_NUMBER().over(partition_by=[WorkflowRun.owner],
                                    order_by=[WorkflowRun.created_at, WorkflowRun.trace_id])
        ranked = (WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.owner, WorkflowRun.created_at,
                                     turn.alias("turn"))
                  .where(self._claimable(time.time())).alias("ranked"))
        query = WorkflowRun.select(ranked.c.trace_id, ranked.c.owner_id).from_(ranked)
        if per_user:
            held = {owner: count for owner, count in (busy or {}).items() if count > 0}
            full = [owner for owner, count in held.items() if count >= per_user]
            # the counts as integer literals: a CASE's parameters would be typed as text
            partly = [(owner, SQL(str(int(per_user - count)))) for owner, count in held.items() if count < per_user]
            allowed = Case(ranked.c.owner_id, partly, SQL(str(int(per_user)))) if partly else per_user
            where = ranked.c.turn <= allowed
            if full:
                where &= ranked.c.owner_id.not_in(full)
            query = query.where(where)
        rows = await self.db.list(query.order_by(ranked.c.turn, ranked.c.created_at, ranked.c.trace_id)
                                  .limit(limit).tuples())
        return [(trace_id, owner) for trace_id, owner in rows]

    async def owners(self, trace_ids: list[str]) -> dict[str, str]:
        """`{trace_id: owner_id}` of these runs (those that exist)."""
        rows = await self.db.list(WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.owner)
                                  .where(WorkflowRun.trace_id.in_(trace_ids)).tuples())
        return {trace_id: owner for trace_id, owner in rows}

    async def claim(self, trace_id: str, *, attempt: bool = True) -> WorkflowRun | None:
        """Take the run if nobody holds it; the row as claimed (its `owner_process` is the
        claim's token), or None. `attempt=False`: a lease that ran out is not counted
        (the store was unreachable, the owner may be alive)."""
        rows = await self.claim_many([trace_id], attempt=attempt)
        return rows[0] if rows else None

    async def claim_many(self, trace_ids: list[str], *, attempt: bool = True) -> list[WorkflowRun]:
        """`claim` for several runs in two statements, whatever their number (a burst of
        runs queued at once): each run still gets a claim token of its own. The rows of
        those taken, in the order asked."""
        if not trace_ids:
            return []
        now = time.time()
        tokens = {trace_id: self.new_token() for trace_id in dict.fromkeys(trace_ids)}
        crashed = WorkflowRun.owner_process.is_null(False) if attempt else False
        counted = Case(None, [((WorkflowRun.attempts == 0) | crashed, WorkflowRun.attempts + 1)],
                       WorkflowRun.attempts)
        changed = await self.db.aexecute(
            WorkflowRun.update(
                owner_process=Case(WorkflowRun.trace_id, list(tokens.items())),
                lease_until=now + self.lease_seconds,
                attempts=counted,
            ).where(WorkflowRun.trace_id.in_(list(tokens)) & self._claimable(now))
        )
        if not changed:
            return []
        rows = {row.trace_id: row for row in await self.db.list(
            WorkflowRun.select().where(WorkflowRun.owner_process.in_(list(tokens.values()))))}
        return [rows[t] for t in tokens if t in rows and rows[t].owner_process == tokens[t]]

    async def renew(self, claims: dict[str, str], *, db: Any = None) -> dict[str, bool]:
        """Extend the leases of these runs (`{trace_id: token}`), executing here, whose
        claims still hold (a run whose end could not be stored is no longer executing: its
        lease runs out and the next claim goes on with it); `{trace_id: cancel_requested}`
        of those held. `db`: the connection to use (the lease loop's own)."""
        if not claims:
            return {}
        db = db or self.db
        now = time.time()
        mine = (WorkflowRun.owner_process.in_(list(claims.values()))
                & WorkflowRun.status.in_(list(ACTIVE)))
        await db.aexecute(WorkflowRun.update(lease_until=now + self.lease_seconds).where(self.in_lock_order(mine)))
        rows = await db.list(
            WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.owner_process,
                               WorkflowRun.cancel_requested).where(mine).tuples()
        )
        return {trace_id: bool(cancel) for trace_id, token, cancel in rows
                if claims.get(trace_id) == token}

    async def hand_back(self, trace_id: str, token: str) -> bool:
        """Give a run up at once (graceful stop): its lease ends now, so another process
        claims it without waiting, and the next claim is not an attempt."""
        changed = await self.db.aexecute(
            WorkflowRun.update(owner_process=None, lease_until=None).where(
                self.holds(trace_id, token) & WorkflowRun.status.in_(list(ACTIVE))
            )
        )
        return bool(changed)

    async def hand_back_many(self, tokens: list[str], *, db: Any = None) -> int:
        """`hand_back` for every run still held by one of these claims, in one statement
        (a stopping process whose run tasks did not finish handing back in time)."""
        if not tokens:
            return 0
        return await (db or self.db).aexecute(
            WorkflowRun.update(owner_process=None, lease_until=None).where(self.in_lock_order(
                WorkflowRun.owner_process.in_(tokens) & WorkflowRun.status.in_(list(ACTIVE))
            ))
        )

    def in_lock_order(self, condition):
        """The runs matching `condition`, their rows locked deepest first (a child before
        its parent), the order of every write that locks several runs (store/ledger.py):
        a renewal never waits for a child's write that waits for the renewal."""
        return WorkflowRun.trace_id.in_(self.locked(
            WorkflowRun.select(WorkflowRun.trace_id).where(condition)
            .order_by(WorkflowRun.depth.desc(), WorkflowRun.trace_id)))

    async def expire_all(self) -> int:
        """Make every unfinished run claimable now: only for a store that just one
        process can serve (SQLite), at that process's start — the last owner is gone."""
        return await self.db.aexecute(
            WorkflowRun.update(lease_until=None).where(WorkflowRun.status.in_(list(ACTIVE)))
        )
