"""Who holds a run: atomic claims, lease renewal and hand-back, in the store.

A run row names its owner (`owner_process`) and the time its lease ends (`lease_until`,
epoch seconds; hosts keep their clocks in sync, as with any lease). A claim is one
conditional `UPDATE … WHERE status is active AND (no lease OR lease ended)`: the store
lets exactly one claimer change the row, whatever the number of processes. The owner
renews all of its leases in one statement; a run it no longer holds (its lease ran out
while the process stalled, and another process took it) is dropped here at once.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from orchestra.db.models import WorkflowRun
from orchestra.engine.vocabulary import ACTIVE


def process_identity() -> str:
    """host:pid:random — unique per process start, readable in the store."""
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Ownership:
    def __init__(self, db: Any, *, me: str, lease_seconds: float) -> None:
        self.db = db
        self.me = me
        self.lease_seconds = lease_seconds

    def _claimable(self, now: float):
        return WorkflowRun.status.in_(list(ACTIVE)) & (
            WorkflowRun.lease_until.is_null() | (WorkflowRun.lease_until < now)
        )

    async def candidates(self, limit: int) -> list[str]:
        """Runs nobody holds (queued, or their owner's lease ran out), oldest first."""
        if limit <= 0:
            return []
        rows = await self.db.list(
            WorkflowRun.select(WorkflowRun.trace_id)
            .where(self._claimable(time.time()))
            .order_by(WorkflowRun.created_at)
            .limit(limit)
            .tuples()
        )
        return [row[0] for row in rows]

    async def claim(self, trace_id: str) -> WorkflowRun | None:
        """Take the run if nobody holds it; the row as claimed, or None."""
        now = time.time()
        changed = await self.db.aexecute(
            WorkflowRun.update(
                owner_process=self.me,
                lease_until=now + self.lease_seconds,
                attempts=WorkflowRun.attempts + 1,
            ).where((WorkflowRun.trace_id == trace_id) & self._claimable(now))
        )
        if not changed:
            return None
        return await WorkflowRun.aget_or_none(
            (WorkflowRun.trace_id == trace_id) & (WorkflowRun.owner_process == self.me)
        )

    async def renew(self, trace_ids: list[str]) -> dict[str, bool]:
        """Extend the leases of these runs, executing here, that this process still holds
        (a run whose end could not be stored is no longer executing: its lease runs out and
        the next claim goes on with it); `{trace_id: cancel_requested}` of those it holds."""
        if not trace_ids:
            return {}
        now = time.time()
        mine = ((WorkflowRun.owner_process == self.me) & WorkflowRun.trace_id.in_(trace_ids)
                & WorkflowRun.status.in_(list(ACTIVE)))
        await self.db.aexecute(WorkflowRun.update(lease_until=now + self.lease_seconds).where(mine))
        rows = await self.db.list(
            WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.cancel_requested).where(mine).tuples()
        )
        return {trace_id: bool(cancel) for trace_id, cancel in rows}

    async def hand_back(self, trace_id: str) -> bool:
        """Give a run up at once (graceful stop): its lease ends now, so another process
        claims it without waiting. (Each claim counts as an attempt, as SPEC says.)"""
        changed = await self.db.aexecute(
            WorkflowRun.update(owner_process=None, lease_until=None).where(
                (WorkflowRun.trace_id == trace_id)
                & (WorkflowRun.owner_process == self.me)
                & WorkflowRun.status.in_(list(ACTIVE))
            )
        )
        return bool(changed)

    async def expire_all(self) -> int:
        """Make every unfinished run claimable now: only for a store that just one
        process can serve (SQLite), at that process's start — the last owner is gone."""
        return await self.db.aexecute(
            WorkflowRun.update(lease_until=None).where(WorkflowRun.status.in_(list(ACTIVE)))
        )
