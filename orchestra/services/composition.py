"""Save-time checks of what a template calls (SPEC §14): the secrets its HTTP steps name
exist, and each `workflow` step names a template the owner may run, which does not call
the template being saved (directly or not) and keeps every chain within MAX_CHAIN runs.

A template's child templates are stored by id (a name is resolved here, once), so the
calls between templates form a graph that this walks from the saved template's
children, at most MAX_CHAIN levels deep.
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import TemplateVersion, WorkflowTemplate, name_key, storable
from orchestra.language.model import MAX_CHAIN
from orchestra.language.shape import walk
from orchestra.language.validate import Checked
from orchestra.services import secrets as secret_service
from orchestra.services.shared import Shared


def children_of(steps: list[dict[str, Any]]) -> set[str]:
    """The template ids a template's workflow steps name (inner steps included)."""
    return {step["workflow"]["template"] for step, _depth, _where in walk(steps or [])
            if isinstance(step.get("workflow"), dict) and isinstance(step["workflow"].get("template"), str)}


async def check_calls(core: Shared, checked: Checked, *, owner_id: str, template_id: str | None) -> None:
    """Add to `checked.problems` every unknown secret and every child template that is
    unknown, the template itself (or calls it), or makes a chain too deep; a child named
    by name is rewritten to its id."""
    missing = await secret_service.missing_names(core, {name for _f, name in checked.secrets})
    for field, name in checked.secrets:
        if name in missing:
            checked.add(field, f"unknown secret '{name}' (an administrator stores it under "
                               "/api/v1/resource/secret)")
    if not checked.children:
        return
    refs = {ref for _f, ref, _flow in checked.children}
    readable = (WorkflowTemplate.owner == owner_id) | (WorkflowTemplate.shared == True)  # noqa: E712
    ids = [r for r in refs if storable(r)]
    rows = await core.db.list(WorkflowTemplate.select(
        WorkflowTemplate.id, WorkflowTemplate.owner, WorkflowTemplate.name_key, WorkflowTemplate.steps).where(
        readable & (WorkflowTemplate.id.in_(ids) | ((WorkflowTemplate.owner == owner_id)
                                                   & WorkflowTemplate.name_key.in_([name_key(r) for r in ids]))))
    )
    by_id = {t.id: t for t in rows}
    by_name = {t.name_key: t for t in rows if t.owner_id == owner_id}
    depths = _Depths(core, template_id)
    for field, ref, flow in checked.children:
        child = by_id.get(ref) or by_name.get(name_key(ref))
        if child is None:
            checked.add(field, f"unknown template {ref!r}: not the id or name of a template you may run")
            continue
        flow["template"] = child.id
        if flow.get("version") is not None and not await core.db.exists(TemplateVersion.select(TemplateVersion.id).where(
                (TemplateVersion.template == child.id) & (TemplateVersion.version == flow["version"]))):
            checked.add(field.replace(".template", ".version"), f"template {ref!r} has no version {flow['version']}")
            continue
        if template_id is not None and child.id == template_id:
            checked.add(field, "a template cannot call itself")
            continue
        depth, calls_back = await depths.of(child)
        if calls_back:
            checked.add(field, f"template {ref!r} calls this template (directly or through others): "
                               "a template cannot call itself")
        elif 1 + depth > MAX_CHAIN:
            checked.add(field, f"the chain of runs would be {1 + depth} deep (this run and its "
                               f"children's children); at most {MAX_CHAIN} runs make a chain")


class _Depths:
    """How many runs the longest chain from a stored template holds (itself included),
    and whether that chain reaches `saved`; read lazily, bounded by MAX_CHAIN levels."""

    def __init__(self, core: Shared, saved: str | None) -> None:
        self.core, self.saved = core, saved
        self.known: dict[str, tuple[int, bool]] = {}

    async def of(self, template: WorkflowTemplate, level: int = 1) -> tuple[int, bool]:
        if template.id in self.known:
            return self.known[template.id]
        self.known[template.id] = (MAX_CHAIN + 1, False)  # a cycle met below reads as too deep
        children = children_of(template.steps)
        depth, back = 1, False
        if self.saved in children:
            back = True
        elif children and level <= MAX_CHAIN:
            rows = await self.core.db.list(WorkflowTemplate.select(WorkflowTemplate.id, WorkflowTemplate.steps)
                                           .where(WorkflowTemplate.id.in_(sorted(children))))
            for row in rows:
                below, reaches = await self.of(row, level + 1)
                depth, back = max(depth, 1 + below), back or reaches
        elif children:
            depth = MAX_CHAIN + 1
        self.known[template.id] = (depth, back)
        return depth, back
