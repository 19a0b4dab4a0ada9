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

A run of a workspace with a monthly budget (SPEC §16) has one more level above its
chain: the workspace's month (store/workspace_month.py). Its calls reserve there too,
in the same transaction, the month's row locked last; a call's settlement is stored on
the month it reserved in, with the run's ledger change (`Change.months`).

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
from orchestra.engine.store.workspace_month import Cap, MonthKey, WorkspaceMonths

MAX_ANCESTORS = 8  # more than a chain holds (SPEC §14: five runs); a guard against a loop


@dataclass(frozen=True)
class Ancestor:
    """A run above a child run, as far as its budget goes."""

    trace_id: str
    budget_pusd: int | None
    on_budget: str


@dataclass(frozen=True)
class Shortfall:
    """The budget a reservation did not fit under: whose (a run's, or a workspace's
    month: `workspace`, `month`), how much, and what is spent."""

    trace_id: str
    budget_pusd: int | None
    spent_pusd: int
    workspace: Cap | None = None
    month: str | None = None


@dataclass(frozen=True)
class Change:
    """A change of a run's ledger not stored yet: `pico` on its row (and its
    ancestors'), and the part of it on workspace months, by month (a call reserved under
    a workspace's cap)."""

    pico: int = 0
    months: tuple[tuple[MonthKey, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pico or self.months)


NO_CHANGE = Change()


class Ledger:
    """What runs executing here spent: stored changes, unstored ones, their chains."""

    def __init__(self, store: Any) -> None:
        self.store = store  # the RunStore: its fence, transactions, row locks and claims
        self.db = store.db
        self._unstored: dict[str, int] = {}
        self._months: dict[str, dict[MonthKey, int]] = {}  # the unstored part on workspace months
        self.months = WorkspaceMonths(self.db)  # the workspaces' months (SPEC §16)
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
        self._months.pop(trace_id, None)
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
    def spend(self, trace_id: str, pico: int, month: MonthKey | None = None) -> None:
        """A settled call's change to the run's ledger (its cost less its reservation),
        kept until the run's next fenced write or reservation stores it; `month`: the
        workspace's month its reservation was made in, which the change is stored on too."""
        if pico:
            self._unstored[trace_id] = self._unstored.get(trace_id, 0) + pico
            if month is not None:
                months = self._months.setdefault(trace_id, {})
                months[month] = months.get(month, 0) + pico
        self.wake(trace_id)

    def take(self, trace_id: str) -> Change:
        """The unstored change, for a write about to store it (in transit until `landed`
        or `keep`)."""
        pico = self._unstored.pop(trace_id, 0)
        months = tuple((key, part) for key, part in self._months.pop(trace_id, {}).items() if part)
        change = Change(pico, months) if pico or months else NO_CHANGE
        if change:
            self._transit[trace_id] = self._transit.get(trace_id, 0) + 1
        return change

    def landed(self, trace_id: str, change: Change) -> None:
        """The write that took `change` committed it (or gave it back)."""
        if change:
            self._arrived(trace_id)
            self.wake(trace_id)

    def _arrived(self, trace_id: str) -> None:
        left = self._transit.get(trace_id, 0) - 1
        if left > 0:
            self._transit[trace_id] = left
        else:
            self._transit.pop(trace_id, None)

    def _restore(self, trace_id: str, change: Change, *, releases: bool = True) -> None:
        """`change` unstored again (`releases` False: only its additions)."""
        if change.pico and (releases or change.pico > 0):
            self._unstored[trace_id] = self._unstored.get(trace_id, 0) + change.pico
        for key, part in change.months:
            if releases or part > 0:
                months = self._months.setdefault(trace_id, {})
                months[key] = months.get(key, 0) + part

    def _put_back(self, trace_id: str, change: Change) -> None:
        """A reservation that did not fit stored nothing: its unstored change is as it
        was (no change for a waiting reservation to look at)."""
        if change:
            self._arrived(trace_id)
            self._restore(trace_id, change)

    def keep(self, trace_id: str, change: Change, *, known_failed: bool) -> None:
        """A write that carried `change` failed: keep it for the next one, unless it may
        have been stored (then a release is dropped: counted twice, it could overspend)."""
        self.landed(trace_id, change)
        if change:
            self._restore(trace_id, change, releases=known_failed)
            self.wake(trace_id)

    async def add(self, trace_id: str, pico: int, months: tuple[tuple[MonthKey, int], ...] = ()) -> None:
        """Inside the run's fenced transaction: `pico` more on its row and each ancestor's,
        nearest first (deepest row first), then `months` on the workspace's months."""
        await self._add_to(trace_id, pico)
        await self.add_above(trace_id, pico, months)

    async def add_above(self, trace_id: str, pico: int, months: tuple[tuple[MonthKey, int], ...] = ()) -> None:
        """`pico` more on each ancestor's row (the run's own is the caller's), nearest
        first, then `months` on the workspace's months (their rows locked last)."""
        for run in self._chains.get(trace_id, ()):
            await self._add_to(run, pico)
        for key, part in months:
            await self.months.add(key, part)

    async def _add_to(self, trace_id: str, pico: int) -> None:
        if pico:
            await self.db.aexecute(WorkflowRun.update(
                spent_pusd=fn.COALESCE(WorkflowRun.spent_pusd, 0) + pico,
            ).where(WorkflowRun.trace_id == trace_id))

    # -- reservations ----------------------------------------------------------------
    async def reserve(self, trace_id: str, pico: int, month: MonthKey | None = None) -> bool:
        """Reserve `pico` under every budget of the run's chain (and, `month`, under its
        workspace's monthly budget), with the changes kept unstored: True when it fit.
        Fenced when this process's claim no longer holds."""
        if trace_id in self._chains or month is not None or self._months.get(trace_id):
            return await self._reserve_in_chain(trace_id, pico, month)
        token = self.store.held(trace_id)
        pending = self.take(trace_id)
        spent = fn.COALESCE(WorkflowRun.spent_pusd, 0)
        try:  # one conditional statement, fenced on the claim
            changed = await self.db.aexecute(
                WorkflowRun.update(spent_pusd=spent + pico + pending.pico).where(
                    self.store.ownership.holds(trace_id, token)
                    & (spent + pico + pending.pico <= WorkflowRun.budget_pusd)))
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

    async def _reserve_in_chain(self, trace_id: str, pico: int, month: MonthKey | None) -> bool:
        """A child run's reservation, or one under its workspace's month, in one
        transaction: the chain's rows locked deepest first and their budgets read (a run
        without a chain: one conditional, fenced statement on its own row), then the
        month's row, last; the reservation (or only the unstored change) added to every
        row. A reservation the month refuses leaves nothing reserved on the runs."""
        pending = self.take(trace_id)
        chained = trace_id in self._chains
        try:
            async with self.store.write_transaction():
                if chained:
                    await self.store.fence(trace_id)
                    rows = await self._chain_rows(trace_id, lock=True)
                    fits = all(r.budget_pusd is None or (r.spent_pusd or 0) + pending.pico + pico <= r.budget_pusd
                               for r in rows)
                else:  # its own row: the change, and the reservation when it fits
                    fits = await self._own_row(trace_id, pico, pending.pico)
                on_rows = fits
                months = dict(pending.months)
                if fits and month is not None:
                    own = months.pop(month, 0)
                    fits = await self.months.reserve(month, own + pico)
                    if not fits:
                        months[month] = own
                for key, part in months.items():
                    await self.months.add(key, part)
                if chained:
                    await self.add(trace_id, pending.pico + (pico if fits else 0))
                elif on_rows and not fits:  # the month refused it: nothing reserved
                    await self._add_to(trace_id, -pico)
        except BaseException:
            self.keep(trace_id, pending, known_failed=False)
            raise
        self.landed(trace_id, pending)
        return fits

    async def _own_row(self, trace_id: str, pico: int, pending: int) -> bool:
        """Inside a transaction: the unstored change and `pico` on the run's own row when
        it fits under its budget (none: it fits), else the change alone; fenced."""
        holds = self.store.ownership.holds(trace_id, self.store.held(trace_id))
        spent = fn.COALESCE(WorkflowRun.spent_pusd, 0)
        if await self.db.aexecute(WorkflowRun.update(spent_pusd=spent + pico + pending).where(
                holds & (WorkflowRun.budget_pusd.is_null() | (spent + pico + pending <= WorkflowRun.budget_pusd)))):
            return True
        if not await self.db.aexecute(WorkflowRun.update(spent_pusd=spent + pending).where(holds)):
            raise Fenced(f"run {trace_id}: this process no longer holds its claim")
        return False

    async def _chain_rows(self, trace_id: str, *, lock: bool = False) -> list[WorkflowRun]:
        runs = [trace_id, *self._chains.get(trace_id, ())]
        query = (WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.budget_pusd, WorkflowRun.spent_pusd,
                                    WorkflowRun.depth)
                 .where(WorkflowRun.trace_id.in_(runs)).order_by(WorkflowRun.depth.desc()))
        return await self.db.list(self.store.locked(query) if lock else query)

    async def shortfall(self, trace_id: str, pico: int, month: MonthKey | None = None) -> Shortfall:
        """The budget of the run's chain that `pico` more does not fit under, the
        nearest first, then the workspace's month (`month`); when none is short any
        more, the month's (a run under one), else the run's own."""
        unstored = self._unstored.get(trace_id, 0)
        rows = await self._chain_rows(trace_id)
        budgeted = [r for r in rows if r.budget_pusd is not None]
        for row in budgeted:
            if (row.spent_pusd or 0) + unstored + pico > row.budget_pusd:
                return Shortfall(row.trace_id, row.budget_pusd, (row.spent_pusd or 0) + unstored)
        if month is not None:
            cap = await self.months.read_cap(month[0])
            spent = await self.months.spent(month) + self._months.get(trace_id, {}).get(month, 0)
            return Shortfall(trace_id, cap.budget_pusd, spent, workspace=cap, month=month[1])
        row = next((r for r in budgeted if r.trace_id == trace_id), budgeted[0] if budgeted else None)
        if row is None:
            return Shortfall(trace_id, None, unstored)
        return Shortfall(row.trace_id, row.budget_pusd, (row.spent_pusd or 0) + unstored)
