"""How a template save becomes an immutable version (SPEC §13).

`record` runs inside the save's transaction: a refused save (422, 409, a lost race for
the name) rolls back and leaves no version. An update first bumps
`workflow_template.version` with one UPDATE, which on PostgreSQL holds the template's
row lock until the transaction ends: a concurrent save of the same template waits
there and then takes the next number, so numbers are consecutive with no gap or
duplicate (SQLite's writers are serialised by BEGIN IMMEDIATE). The unique (template,
version) index is the last word.
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import TemplateVersion, WorkflowTemplate
from orchestra.errors import NotFoundError
from orchestra.language import shape
from orchestra.services.shared import Shared


def step_count(steps: list[dict[str, Any]]) -> int:
    """Every step with an id, inner ones of foreach and loop included."""
    return sum(1 for _ in shape.walk(steps or []))


async def next_number(core: Shared, template: WorkflowTemplate, *, create: bool) -> int:
    """The number this save takes (call inside the save's transaction, before the save):
    1 for a new template, else the template's latest plus one, claimed under its lock."""
    if create:
        return 1
    await core.db.aexecute(WorkflowTemplate.update(version=WorkflowTemplate.version + 1)
                           .where(WorkflowTemplate.id == template.id))
    return await core.db.scalar(WorkflowTemplate.select(WorkflowTemplate.version)
                                .where(WorkflowTemplate.id == template.id))


async def record(core: Shared, template: WorkflowTemplate, *, author_id: str | None) -> TemplateVersion:
    """Store the saved template's content as its version `template.version`."""
    return await TemplateVersion.acreate(
        template=template.id, version=template.version, name=template.name,
        description=template.description, steps=template.steps, spec=template.spec,
        step_count=step_count(template.steps), author=author_id,
    )


def content(row: TemplateVersion | WorkflowTemplate) -> dict[str, Any]:
    """What a version holds: `{name, description, steps, spec}`."""
    return {"name": row.name, "description": row.description or "", "steps": row.steps,
            "spec": row.spec or {}}


async def read(core: Shared, template: WorkflowTemplate, number: int) -> TemplateVersion:
    """Version `number` of `template`, or 404."""
    row = await TemplateVersion.aget_or_none(
        (TemplateVersion.template == template.id) & (TemplateVersion.version == number))
    if row is None:
        raise NotFoundError(f"The template '{template.id}' has no version {number} "
                            f"(its latest is {template.version}).")
    return row


async def for_run(core: Shared, template: WorkflowTemplate, number: int | None) -> TemplateVersion | WorkflowTemplate:
    """What a run of `template` runs: version `number`, or the latest (the template row
    itself holds the latest version's content)."""
    if number is None or number == template.version:
        return template
    return await read(core, template, number)
