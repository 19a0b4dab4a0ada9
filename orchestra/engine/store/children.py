"""The run store's statements about child runs (SPEC §14): a child stored with its
parent's link and `child_started` in one fenced write of the parent's owner, the
active runs below a run, and what a waiting parent reads (its template, its questions
shown already)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestra.db.models import (
    RunEvent,
    TemplateVersion,
    WorkflowRun,
    WorkflowTemplate,
)
from orchestra.db.workspace_models import Workspace
from orchestra.engine.model import At
from orchestra.engine.store.creation import NewRun, child_budget
from orchestra.engine.store.events import Event, Item
from orchestra.engine.store.runs import RunStore
from orchestra.vocabulary import ACTIVE, EventKind, RunStatus

#: A child's events its waiting parent shows too (with `child_trace_id`): its questions
#: and answers, and its pauses for budget (SPEC §12).
MIRRORED = (EventKind.REPLY_REQUESTED, EventKind.REPLY_RECEIVED, EventKind.BUDGET_EXHAUSTED)


def mirror_key(kind: str, data: dict[str, Any], seq: int | None = None) -> tuple[str, Any]:
    """What tells a mirrored event apart: a question's request id, else the child's seq."""
    return kind, data.get("request_id") or data.get("child_seq") or seq


@dataclass(frozen=True)
class NewChild:
    """A child run about to be stored."""

    trace_id: str
    owner_id: str
    template: WorkflowTemplate
    depth: int
    input_text: str
    input_value: Any
    steps: list[dict[str, Any]]  # the version it runs (SPEC §13): its steps and spec
    spec: dict[str, Any] | None
    version: int | None


class ChildRuns:
    """Child runs in the store, as a parent's owner writes and reads them."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.db = store.db

    async def lookup(self, parent: str, child: str) -> tuple[bool, int]:
        """(whether the child run is stored already, the parent's level in its chain), in
        one read."""
        rows = await self.db.list(WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.depth)
                                  .where(WorkflowRun.trace_id.in_([parent, child])))
        depths = {row.trace_id: row.depth or 1 for row in rows}
        return child in depths, depths.get(parent, 1)

    async def template(self, template_id: str) -> WorkflowTemplate | None:
        return await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)

    async def version(self, template_id: str, number: int) -> TemplateVersion | None:
        return await TemplateVersion.aget_or_none(
            (TemplateVersion.template == template_id) & (TemplateVersion.version == number))

    async def is_team(self, workspace_id: str | None) -> bool:
        """Whether `workspace_id` is a team workspace (not a personal one, not none)."""
        return workspace_id is not None and await self.db.exists(Workspace.select(Workspace.id).where(
            (Workspace.id == workspace_id) & (Workspace.personal == False)))  # noqa: E712

    async def template_exists(self, template_id: str) -> bool:
        return await self.db.exists(WorkflowTemplate.select(WorkflowTemplate.id)
                                    .where(WorkflowTemplate.id == template_id))

    async def start(self, parent: str, at: At, child: NewChild, values: dict[str, Any],
                    items: list[Item], *, claim: Callable[[str], dict[str, Any]]) -> WorkflowRun:
        """The child run (queued, its step rows pending), the parent step's row (`values`
        and its `child_trace_id`) and the parent's events (`step_started`,
        `child_started`), in one fenced transaction; the child's row as stored. `claim`:
        the engine's `claim_now` (claimed by this process when it has room: it runs here
        at once, no claim round; else it waits for a claim)."""
        template = child.template
        new = NewRun(
            trace_id=child.trace_id, owner_id=child.owner_id, template_id=template.id,
            template_name=template.name, steps=child.steps, spec=child.spec, template_version=child.version,
            input_text=child.input_text, input_value=child.input_value,
            parent_trace_id=parent, parent_path=at.path, depth=child.depth, workspace_id=template.workspace_id,
            budget_pusd=child_budget(child.spec))  # the budgets above it bound it too (ledger.py)
        stored: list[WorkflowRun] = []

        async def store() -> list[Event]:
            stored[:] = await self.store.create([new], claim=claim)
            await self.store.put_instance(parent, at.path, at.step_id, **values, child_trace_id=child.trace_id)
            return await self.store.events.insert(parent, items)

        await self.store.write(parent, store)
        return stored[0]

    async def tree_active(self, trace_id: str) -> tuple[str, int]:
        """(the root of the tree of child runs `trace_id` is in, how many of the tree's runs
        are unfinished: the root and every unfinished run below it, SPEC §15b)."""
        root = trace_id
        while True:  # a chain is short (language.model.MAX_CHAIN)
            rows = await self.db.list(WorkflowRun.select(WorkflowRun.parent_trace_id)
                                      .where(WorkflowRun.trace_id == root).tuples())
            if not rows or rows[0][0] is None:
                break
            root = rows[0][0]
        return root, 1 + len(await self.active_below(root))

    async def active_below(self, trace_id: str) -> list[str]:
        """Every unfinished run below `trace_id` (active or waiting for budget), all
        levels, top down."""
        found, level = [], [trace_id]
        while level:
            rows = await self.db.list(WorkflowRun.select(WorkflowRun.trace_id).where(
                WorkflowRun.parent_trace_id.in_(level)
                & WorkflowRun.status.in_([*ACTIVE, RunStatus.WAITING_BUDGET])))
            level = [row.trace_id for row in rows]
            found += level
        return found

    async def shown(self, parent: str, child: str) -> set[tuple[str, Any]]:
        """The child's questions (and answers) the parent shows already."""
        rows = await self.db.list(RunEvent.select(RunEvent.kind, RunEvent.data).where(
            (RunEvent.run == parent) & RunEvent.kind.in_(list(MIRRORED))))
        return {mirror_key(row.kind, row.data) for row in rows if row.data.get("child_trace_id") == child}

    async def spent(self, trace_id: str) -> int | None:
        """A run's ledger (its tree's spend, pico-dollars); None: nothing priced."""
        rows = await self.db.list(WorkflowRun.select(WorkflowRun.spent_pusd).where(WorkflowRun.trace_id == trace_id))
        return rows[0].spent_pusd if rows else None
