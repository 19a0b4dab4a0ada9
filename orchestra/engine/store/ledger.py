"""The run store's spending ledger (SPEC §12, engine/spend.py): `workflow_run.spent_pusd`
in whole pico-dollars, reservations included, rolled up the chain of runs (SPEC §14).

A run's ledger counts its own calls and those of every run below it: a child's change is
added, in the same fenced transaction, to its own row and to each ancestor's, so a
parent's `cost_usd` is its whole tree's, counted exactly once (a change is stored once,
by the one transaction that carries it). A reservation fits only when it fits under
every budget of the chain (the run's own and its ancestors'), so a parent's budget bounds
its descendants too.

Rows are locked deepest first (the run's own row by its fence, then its parent's, and so
on up): every transaction that locks several runs' rows goes in that order (the lease
renewal included, `Ownership.renew`), so two of them never wait for each other.

Changes settled here and not yet stored ride along with the run's next fenced write or
reservation (at most one extra store transaction per call). A change taken by a write
that has not committed yet is *in transit*: a reservation that does not fit waits for it
to land (`in_transit`, `changed`) before it may say the budget is spent (SPEC §15b).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from peewee import fn

from orchestra.db.models import WorkflowRun
from orchestra.engine.store.events import Fenced

MAX_ANCESTORS = 8  # more than a chain holds (SPEC §14: five runs); a guard against a loop


@dataclass(frozen=True)
class Ancestor:
    """A run above a child run, as far as its budget goes."""

    trace_id: str
    budget_pusd: int | None
    on_budget: str


@dataclass(frozen=True)
class Shortfall:
    """The budget a reservation did not fit under: whose, how much, and what is spent."""

    trace_id: str
    budget_pusd: int | None
    spent_pusd: int


class Ledger:
    """What runs executing here spent: stored changes, unstored ones, their chains."""

    def __init__(self, store: Any) -> None:
        self.store = store  # the RunStore: its fence, transactions, row locks and claims
        self.db = store.db
        self._unstored: dict[str, int] = {}
        self._transit: dict[str, int] = {}  # writes carrying a change, not committed yet
        self._wakes: dict[str, asyncio.Future] = {}  # a reservation waiting for a change
        self._chains: dict[str, tuple[str, ...]] = {}  # a child's ancestors, nearest first

    # -- a run's chain ---------------------------------------------------------------
    async def ancestors(self, trace_id: str, parent: str | None) -> list[Ancestor]:
        """The runs above a child run, nearest first; from now on its changes are added
        to theirs too."""
        found: list[Ancestor] = []
        while parent and len(found) < MAX_ANCESTORS:
            row = await WorkflowRun.aget_or_none(WorkflowRun.trace_id == parent)
            if row is None:
                break
            limits = (row.spec or {}).get("limits") or {}
            found.append(Ancestor(row.trace_id, row.budget_pusd, limits.get("on_budget") or "fail"))
            parent = row.parent_trace_id
        if found:
            self._chains[trace_id] = tuple(a.trace_id for a in found)
        return found

    def forget(self, trace_id: str) -> None:
        self._unstored.pop(trace_id, None)
        self._transit.pop(trace_id, None)
        self._chains.pop(trace_id, None)
        self.wake(trace_id)

    # -- waiting for a change (engine/spend.py: a reservation that did not fit) ---------
    def changed(self, trace_id: str) -> asyncio.Future:
        """A future done at the run's next ledger change here: a call settled, or a write
        carrying a change landed (committed or not)."""
        wake = self._wakes.get(trace_id)
        if wake is None or wake.done():
            wake = self._wakes[trace_id] = asyncio.get_running_loop().create_future()
        return wake

    def wake(self, trace_id: str) -> None:
        wake = self._wakes.pop(trace_id, None)
        if wake is not None and not wake.done():
            wake.set_result(None)

    def in_transit(self, trace_id: str) -> bool:
        """A write carrying a change of the run's ledger has not landed yet."""
        return self._transit.get(trace_id, 0) > 0

    # -- unstored changes ------------------------------------------------------------
    def spend(self, trace_id: str, pico: int) -> None:
        """A settled call's change to the run's ledger (its cost less its reservation),
        kept until the run's next fenced write or reservation stores it."""
        if pico:
            self._unstored[trace_id] = self._unstored.get(trace_id, 0) + pico
        self.wake(trace_id)

    def take(self, trace_id: str) -> int:
        """The unstored change, for a write about to store it (in transit until `landed`
        or `keep`)."""
        pico = self._unstored.pop(trace_id, 0)
        if pico:
            self._transit[trace_id] = self._transit.get(trace_id, 0) + 1
        return pico

    def landed(self, trace_id: str, pico: int) -> None:
        """The write that took `pico` committed it (or gave it back)."""
        if pico:
            self._arrived(trace_id)
            self.wake(trace_id)

    def _arrived(self, trace_id: str) -> None:
        left = self._transit.get(trace_id, 0) - 1
        if left > 0:
            self._transit[trace_id] = left
        else:
            self._transit.pop(trace_id, None)

    def _put_back(self, trace_id: str, pico: int) -> None:
        """A reservation that did not fit stored nothing: its unstored change is as it
        was (no change for a waiting reservation to look at)."""
        if pico:
            self._arrived(trace_id)
            self._unstored[trace_id] = self._unstored.get(trace_id, 0) + pico

    def keep(self, trace_id: str, pico: int, *, known_failed: bool) -> None:
        """A write that carried `pico` failed: keep it for the next one, unless it may have
        been stored (then a release is dropped: counted twice, it could overspend)."""
        self.landed(trace_id, pico)
        if pico and (known_failed or pico > 0):
            self.spend(trace_id, pico)

    async def add(self, trace_id: str, pico: int) -> None:
        """Inside the run's fenced transaction: `pico` more on its row and each ancestor's,
        nearest first (deepest row first)."""
        await self._add_to(trace_id, pico)
        await self.add_above(trace_id, pico)

    async def add_above(self, trace_id: str, pico: int) -> None:
        """`pico` more on each ancestor's row (the run's own is the caller's), nearest first."""
        for run in self._chains.get(trace_id, ()):
            await self._add_to(run, pico)

    async def _add_to(self, trace_id: str, pico: int) -> None:
        if pico:
            await self.db.aexecute(WorkflowRun.update(
                spent_pusd=fn.COALESCE(WorkflowRun.spent_pusd, 0) + pico,
            ).where(WorkflowRun.trace_id == trace_id))

    # -- reservations ----------------------------------------------------------------
    async def reserve(self, trace_id: str, pico: int) -> bool:
        """Reserve `pico` under every budget of the run's chain, with the changes kept
        unstored: True when it fit. Fenced when this process's claim no longer holds."""
        if trace_id in self._chains:
            return await self._reserve_in_chain(trace_id, pico)
        token = self.store.held(trace_id)
        pending = self.take(trace_id)
        spent = fn.COALESCE(WorkflowRun.spent_pusd, 0)
        try:  # one conditional statement, fenced on the claim
            changed = await self.db.aexecute(
                WorkflowRun.update(spent_pusd=spent + pico + pending).where(
                    self.store.ownership.holds(trace_id, token)
                    & (spent + pico + pending <= WorkflowRun.budget_pusd)))
        except BaseException:
            self.keep(trace_id, pending, known_failed=False)
            raise
        if changed:
            self.landed(trace_id, pending)
            return True
        self._put_back(trace_id, pending)
        if await WorkflowRun.aget_or_none(self.store.ownership.holds(trace_id, token)) is None:
            raise Fenced(f"run {trace_id}: this process no longer holds its claim")
        return False

    async def _reserve_in_chain(self, trace_id: str, pico: int) -> bool:
        """A child run's reservation: its chain's rows locked deepest first, the budgets
        read, and the reservation (or only the unstored change) added to every row."""
        pending = self.take(trace_id)
        try:
            async with self.store.write_transaction():
                await self.store.fence(trace_id)
                rows = await self._chain_rows(trace_id, lock=True)
                fits = all(r.budget_pusd is None or (r.spent_pusd or 0) + pending + pico <= r.budget_pusd
                           for r in rows)
                await self.add(trace_id, pending + (pico if fits else 0))
        except BaseException:
            self.keep(trace_id, pending, known_failed=False)
            raise
        self.landed(trace_id, pending)
        return fits

    async def _chain_rows(self, trace_id: str, *, lock: bool = False) -> list[WorkflowRun]:
        runs = [trace_id, *self._chains.get(trace_id, ())]
        query = (WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.budget_pusd, WorkflowRun.spent_pusd,
                                    WorkflowRun.depth)
                 .where(WorkflowRun.trace_id.in_(runs)).order_by(WorkflowRun.depth.desc()))
        return await self.db.list(self.store.locked(query) if lock else query)

    async def shortfall(self, trace_id: str, pico: int) -> Shortfall:
        """The budget of the run's chain that `pico` more does not fit under, the
        nearest first (the run's own when none is short any more)."""
        unstored = self._unstored.get(trace_id, 0)
        rows = await self._chain_rows(trace_id)
        budgeted = [r for r in rows if r.budget_pusd is not None]
        for row in budgeted:
            if (row.spent_pusd or 0) + unstored + pico > row.budget_pusd:
                return Shortfall(row.trace_id, row.budget_pusd, (row.spent_pusd or 0) + unstored)
        row = next((r for r in budgeted if r.trace_id == trace_id), budgeted[0] if budgeted else None)
        if row is None:
            return Shortfall(trace_id, None, unstored)
        return Shortfall(row.trace_id, row.budget_pusd, (row.spent_pusd or 0) + unstored)
