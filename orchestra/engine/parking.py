"""Parking (SPEC §15b): a run whose every call waits holds no task.

When each call of a run in flight waits on something that wakes it from the store — a
human step's question, a child run (`LiveRun.parkable`) — the run is *parked*: its task
ends, its claim is given up and the store holds it `PARKED` (store/ownership.py) until
a reply, its child's end or a cancel clears its lease, or its wake time comes (a human
step's or a workflow step's `timeout_seconds`, the run's `limits.deadline_seconds`).
The next claim round of any process — fair across owners, under the per-user cap — then
goes on with it from its stored instances and questions, as after a take-over but with
nothing said (`LiveRun.unparked`: no `run_resumed`, no second `step_started`).

So a process holds nothing for a waiting run: no task, no future, no feed, no MCP
session, no run slot, no store connection. Waits that keep state only in memory stay in
their task (holding no slot): an `ask_user` tool call inside a model conversation, a
retry delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from orchestra.db.models import WorkflowRun
from orchestra.db.signals import Signals
from orchestra.engine.live import LiveRun, LiveRuns
from orchestra.engine.model import StopReason
from orchestra.engine.store import RunStore
from orchestra.engine.store.ownership import NEVER, PARKED
from orchestra.vocabulary import ACTIVE

logger = logging.getLogger("orchestra.engine")

#: How long a run stays idle before it parks: a sibling step about to start, a reply
#: already on its way, need not cost a park and a claim.
PARK_AFTER = 0.05


async def wake_parents_of(db, template_id: str, *, lock: bool) -> int:
    """The parked runs whose child runs run `template_id`, claimable now: the template is
    being deleted (inside that transaction), and a parent waiting on such a child fails
    its step (child_step.py). `lock` (PostgreSQL): the parents' rows are locked first, so
    a parent parking meanwhile waits for the delete and sees it (`RunStore.park`). How
    many were parked."""
    parents = [trace_id for (trace_id,) in await db.list(
        WorkflowRun.select(WorkflowRun.parent_trace_id).distinct()
        .where((WorkflowRun.template == template_id) & WorkflowRun.status.in_(list(ACTIVE))
               & WorkflowRun.parent_trace_id.is_null(False)).tuples())]
    if not parents:
        return 0
    if lock:
        await db.list(WorkflowRun.select(WorkflowRun.trace_id).where(WorkflowRun.trace_id.in_(parents))
                      .order_by(WorkflowRun.depth.desc(), WorkflowRun.trace_id).for_update())
    return await db.aexecute(WorkflowRun.update(lease_until=None).where(
        WorkflowRun.trace_id.in_(parents) & (WorkflowRun.owner_process == PARKED)))


class Parking:
    """Engine part: parking idle runs, and waking parked ones."""

    def __init__(self, *, store: RunStore, runs: LiveRuns, signals: Signals) -> None:
        self.store = store
        self.runs = runs
        self.signals = signals
        self.after: float | None = PARK_AFTER  # a knob tests turn (None: runs never park)
        self._tasks: set[asyncio.Task] = set()

    def soon(self, live: LiveRun) -> None:
        """`LiveRun.on_idle`: every call of the run waits; park it unless that changes
        within `after` seconds."""
        if live.park_timer is None and not live.stop_asked and self.after is not None:
            live.park_timer = asyncio.get_running_loop().call_later(self.after, self._check, live)

    def _check(self, live: LiveRun) -> None:
        live.park_timer = None
        if live.idle and live.started and not (live.stop_asked or live.ending or self.runs.stopping):
            live.parking = dict(live.parked_on)
            self.runs.stop(live, StopReason.PARK)

    @staticmethod
    def wake_at(live: LiveRun) -> float:
        """When the parked run must go on by itself (epoch seconds; `NEVER`: only a reply,
        a child's end or a cancel wakes it)."""
        times = [wait.deadline for wait in live.parking.values() if wait.deadline is not None]
        if live.options.deadline_seconds:
            times.append((live.started_epoch or time.time()) + live.options.deadline_seconds)
        return min(times, default=NEVER)

    async def park(self, live: LiveRun) -> bool:
        """The run's task was stopped to park it (its writes settled): store it parked.
        False when something it waits for came meanwhile, its cancel was asked or this
        process lost it: the caller hands it back (claimable at once) instead."""
        wake = self.wake_at(live)
        waits = live.parking.values()
        parked = await self.store.park(
            live.trace_id, wake, questions=[w.request_id for w in waits if w.request_id],
            children=[w.child for w in waits if w.child])
        if parked and wake < NEVER:  # a claim round here then; other processes' come anyway
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + max(0.0, wake - time.time()) + 0.01, self.runs.wake)
        return parked

    async def unpark(self, trace_id: str) -> None:
        """A run parked a moment ago is claimable now (its cancel came as it parked)."""
        await self.store.ownership.unpark([trace_id])
        await self.store.release()
        self.runs.wake()

    def woken(self, trace_id: str) -> None:
        """A parked run was made claimable (a reply, its child's end): a claim round here,
        and a `wake` for the other processes."""
        self.runs.wake()
        task = asyncio.get_running_loop().create_task(self._tell(trace_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell(self, trace_id: str) -> None:
        try:
            await self.signals.notify("control", f"wake:{trace_id}")
        except Exception:  # noqa: BLE001 - the other processes' claim loops find it anyway
            logger.info("could not signal the wake of run %s", trace_id, exc_info=True)

    async def close(self) -> None:
        if self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(list(self._tasks), timeout=2)
