"""Save-time checks of what a template calls (SPEC §14, §15b): the secrets its HTTP steps
name may go to the host each step's URL writes (services/secrets.py), and each `workflow` step names a template of the
template's workspace (or a shared one: SPEC §16), which does not call
the template being saved (directly or not) and keeps every chain within MAX_CHAIN runs.

A template's child templates are stored by id (a name is resolved here, once), so the
calls between templates form a graph that this walks from the saved template's
children, at most MAX_CHAIN levels deep. A child pinned to a `version` is walked with
that version's steps, not its template's latest (SPEC §15b: a pinned version that calls
back is a cycle).
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import TemplateVersion, WorkflowTemplate, name_key, storable
from orchestra.language.model import MAX_CHAIN
from orchestra.language.shape import walk
from orchestra.language.validate import Checked
from orchestra.services import secrets as secret_service
from orchestra.services import workspace_scope
from orchestra.services.shared import Shared


def children_of(steps: list[dict[str, Any]]) -> set[str]:
    """The template ids a template's workflow steps name (inner steps included)."""
    return {ref for ref, _version in calls_of(steps)}


def calls_of(steps: list[dict[str, Any]]) -> set[tuple[str, int | None]]:
    """(template id, pinned version or None for the latest) of each workflow step."""
    found: set[tuple[str, int | None]] = set()
    for step, _depth, _where in walk(steps or []):
        flow = step.get("workflow")
        if isinstance(flow, dict) and isinstance(flow.get("template"), str):
            version = flow.get("version")
            found.add((flow["template"], version if isinstance(version, int) else None))
    return found


async def check_calls(core: Shared, checked: Checked, *, owner_id: str, template_id: str | None,
                      workspace_id: str | None = None) -> None:
    """Add to `checked.problems` every secret a step may not send where its URL says (a
    template of `workspace_id` sees that workspace's secrets and the instance-wide ones) and
    every child template that is unknown (another workspace's reads alike: a child is a
    template of `workspace_id` or a shared one), the template itself (or calls it), or
    makes a chain too deep; a child named by name is rewritten to its id."""
    for field, problem in await secret_service.save_refusals(core, checked.secrets, workspace_id):
        checked.add(field, problem)
    if not checked.children:
        return
    refs = {ref for _f, ref, _flow in checked.children}
    # SPEC §16: a child is a template of this one's workspace (any of a team workspace's,
    # whoever made it) or a shared one; a name is looked up in the workspace only
    mine, team = await workspace_scope.in_workspace(core, owner_id, workspace_id, WorkflowTemplate.owner,
                                                    WorkflowTemplate.workspace_id)
    ids = [r for r in refs if storable(r)]
    columns = (WorkflowTemplate.id, WorkflowTemplate.name_key, WorkflowTemplate.steps)
    by_id = {t.id: t for t in await core.db.list(WorkflowTemplate.select(*columns).where(
        WorkflowTemplate.id.in_(ids) & (mine | (WorkflowTemplate.shared == True))))}  # noqa: E712
    by_name = {t.name_key: t for t in await core.db.list(WorkflowTemplate.select(*columns).where(
        mine & WorkflowTemplate.name_key.in_([name_key(r) for r in ids])))}
    where = f"of the workspace '{team.name}'" if team is not None else "of yours"
    depths = _Depths(core, template_id)
    for field, ref, flow in checked.children:
        child = by_id.get(ref) or by_name.get(name_key(ref))
        if child is None:
            checked.add(field, f"unknown template {ref!r}: not the id or name of a template {where} "
                               "or a shared one")
            continue
        flow["template"] = child.id
        steps = child.steps
        if flow.get("version") is not None:
            pinned = await TemplateVersion.aget_or_none(
                (TemplateVersion.template == child.id) & (TemplateVersion.version == flow["version"]))
            if pinned is None:
                checked.add(field.replace(".template", ".version"), f"template {ref!r} has no version {flow['version']}")
                continue
            steps = pinned.steps
        if template_id is not None and child.id == template_id:
            checked.add(field, "a template cannot call itself")
            continue
        depth, calls_back = await depths.of(child.id, flow.get("version"), steps)
        if calls_back:
            checked.add(field, f"template {ref!r} calls this template (directly or through others): "
                               "a template cannot call itself")
        elif 1 + depth > MAX_CHAIN:
            checked.add(field, f"the chain of runs would be {1 + depth} deep (this run and its "
                               f"children's children); at most {MAX_CHAIN} runs make a chain")


class _Depths:
    """How many runs the longest chain from a stored template (at a pinned version, or
    its latest) holds, itself included, and whether that chain reaches `saved`; read
    lazily, bounded by MAX_CHAIN levels."""

    def __init__(self, core: Shared, saved: str | None) -> None:
        self.core, self.saved = core, saved
        self.known: dict[tuple[str, int | None], tuple[int, bool]] = {}

    async def of(self, template_id: str, version: int | None, steps: list[dict[str, Any]],
                 level: int = 1) -> tuple[int, bool]:
        key = (template_id, version)
        if key in self.known:
            return self.known[key]
        self.known[key] = (MAX_CHAIN + 1, False)  # a cycle met below reads as too deep
        calls = calls_of(steps)
        depth, back = 1, False
        if self.saved in {ref for ref, _v in calls}:
            back = True
        elif calls and level <= MAX_CHAIN:
            for (ref, pinned), below_steps in (await self._steps(calls)).items():
                below, reaches = await self.of(ref, pinned, below_steps, level + 1)
                depth, back = max(depth, 1 + below), back or reaches
        elif calls:
            depth = MAX_CHAIN + 1
        self.known[key] = (depth, back)
        return depth, back

    async def _steps(self, calls: set[tuple[str, int | None]]
                     ) -> dict[tuple[str, int | None], list[dict[str, Any]]]:
        """The steps each call runs: a pinned version's, or the template's latest (a
        call of a template or version since deleted runs nothing)."""
        found: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
        latest = sorted({ref for ref, pinned in calls if pinned is None})
        if latest:
            rows = await self.core.db.list(WorkflowTemplate.select(WorkflowTemplate.id, WorkflowTemplate.steps)
                                           .where(WorkflowTemplate.id.in_(latest)))
            found.update({(row.id, None): row.steps for row in rows})
        for ref in sorted({ref for ref, pinned in calls if pinned is not None}):
            numbers = sorted(pinned for r, pinned in calls if r == ref and pinned is not None)
            rows = await self.core.db.list(TemplateVersion.select(TemplateVersion.version, TemplateVersion.steps)
                                           .where((TemplateVersion.template == ref)
                                                  & TemplateVersion.version.in_(numbers)))
            found.update({(ref, row.version): row.steps for row in rows})
        return found
