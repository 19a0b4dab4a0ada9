"""A workspace's month (SPEC §16 "Money"): `limits.monthly_budget_usd` caps what all the
workspace's runs spend in a calendar month (UTC), under §12's reservation rule.

The month is one more level above a run's chain of budgets (store/ledger.py): a call of
a run in a workspace with a cap reserves its worst case on its run's row, its
ancestors' and the workspace's month row (`workspace_month`, keyed by workspace and
"YYYY-MM": a running total, open reservations included), in one fenced transaction, the
month's row last (every transaction that locks it has locked its run rows before: no
two wait for each other). The month's part is one conditional statement, `spent +
reservation <= cap`, so two processes' calls never both take the month's last room (on
PostgreSQL the second waits for the first's row lock and tests the row as the first
left it), comparing with the cap as stored now (`workspace.monthly_budget_pusd`, written
with `limits`). After the call, its settlement (cost less reservation) rides with the run's
next fenced write to the same row — the month its reservation was made in, so a call
across midnight of the month's last day settles where it reserved. A new month is a new
row, from zero; months past are never read.

Whether a workspace has a cap is kept here per process (`cap`), read once per workspace
and dropped when any process changes a workspace's limits (the `cache` hint: the
trigger of migration 0023 on PostgreSQL, the service's own announcement on SQLite): a
workspace without a cap costs its calls nothing. The reservation itself compares with
the cap in the store: a raised or lowered cap holds from the next call.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from peewee import fn

from orchestra.db.workspace_models import Workspace, WorkspaceMonth

#: A workspace's month: (workspace_id, "YYYY-MM").
MonthKey = tuple[str, str]


def month_of(when: dt.datetime) -> str:
    """The calendar month (UTC) of a moment, "YYYY-MM"."""
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC)
    return f"{when.year:04d}-{when.month:02d}"


@dataclass(frozen=True)
class Cap:
    """A workspace's monthly budget as a reservation sees it (None: no cap)."""

    workspace_id: str
    name: str
    budget_pusd: int | None
    on_budget: str


#: What a missing cap compares as (the conditional then always holds): 2**62 pico-dollars.
NO_CAP = 2**62


def cap_of(workspace_id: str, row: Workspace | None) -> Cap:
    if row is None:
        return Cap(workspace_id, "", None, "fail")
    return Cap(workspace_id, row.name, row.monthly_budget_pusd, (row.limits or {}).get("on_budget") or "fail")


class WorkspaceMonths:
    """The month rows (inside the caller's transaction) and this process's copy of which
    workspaces have a cap."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self._caps: dict[str, Cap] = {}
        self._generation = 0  # a copy read before an invalidation is not kept

    # -- whether a workspace's calls reserve ---------------------------------------------
    async def cap(self, workspace_id: str) -> Cap:
        """The workspace's cap as this process knows it (read once, kept until a
        workspace's limits change anywhere)."""
        known = self._caps.get(workspace_id)
        if known is not None:
            return known
        generation = self._generation
        found = await self.read_cap(workspace_id)
        if generation == self._generation:
            self._caps[workspace_id] = found
        return found

    def invalidate(self) -> None:
        self._caps.clear()
        self._generation += 1

    async def read_cap(self, workspace_id: str) -> Cap:
        rows = await self.db.list(Workspace.select(Workspace.id, Workspace.name, Workspace.limits,
                                                   Workspace.monthly_budget_pusd).where(Workspace.id == workspace_id))
        return cap_of(workspace_id, rows[0] if rows else None)

    # -- the month's row (inside a transaction that locked the run's rows first) ---------
    async def reserve(self, key: MonthKey, pico: int) -> bool:
        """`pico` more on the month's row if it fits under the workspace's cap as stored
        now, in one statement (no cap any more: it always fits, and is counted all the
        same, so that its settlement finds it): whether it fit."""
        workspace_id, month = key
        row = (WorkspaceMonth.workspace == workspace_id) & (WorkspaceMonth.month == month)
        cap = Workspace.select(Workspace.monthly_budget_pusd).where(Workspace.id == workspace_id)
        fits = row & (WorkspaceMonth.spent_pusd + pico <= fn.COALESCE(cap, NO_CAP))
        update = WorkspaceMonth.update(spent_pusd=WorkspaceMonth.spent_pusd + pico).where(fits)
        if await self.db.aexecute(update):
            return True
        if await self.db.exists(WorkspaceMonth.select(WorkspaceMonth.month).where(row)):
            return False  # the month's row is there: the call does not fit
        # the month's first call: a row from zero (another process's may win), then again
        await self.db.aexecute(WorkspaceMonth.insert(workspace=workspace_id, month=month, spent_pusd=0)
                               .on_conflict_ignore())
        return bool(await self.db.aexecute(update))

    async def add(self, key: MonthKey, pico: int) -> None:
        """A settled change (cost less reservation) on the month the reservation was in."""
        if pico:
            workspace_id, month = key
            await self.db.aexecute(WorkspaceMonth.update(spent_pusd=WorkspaceMonth.spent_pusd + pico).where(
                (WorkspaceMonth.workspace == workspace_id) & (WorkspaceMonth.month == month)))

    async def spent(self, key: MonthKey) -> int:
        """What the month's row holds (0: no row yet)."""
        workspace_id, month = key
        rows = await self.db.list(WorkspaceMonth.select(WorkspaceMonth.spent_pusd).where(
            (WorkspaceMonth.workspace == workspace_id) & (WorkspaceMonth.month == month)))
        return rows[0].spent_pusd if rows else 0
