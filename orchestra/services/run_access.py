"""Who may run which template: one rule for every way a run starts (a person's
`POST /run`, an API key, a schedule, a webhook), so that keys, schedules and hooks
check at creation exactly what a start checks later.

A user may run a template they own or one marked `shared` (SPEC §3, §4); being an
administrator does not open another user's private template.
"""

from __future__ import annotations

from orchestra.db.models import WorkflowTemplate, storable
from orchestra.errors import ValidationError
from orchestra.services.shared import Shared

TEMPLATE_ID_MAX = 36


def may_run(template: WorkflowTemplate, user_id: str) -> bool:
    """Whether `user_id` may start runs of `template`."""
    return template.owner_id == user_id or bool(template.shared)


async def runnable_template(core: Shared, *, user_id: str, template_id: str) -> WorkflowTemplate | None:
    """The template when `user_id` may run it; None when it does not exist or they may not."""
    if not isinstance(template_id, str) or len(template_id) > TEMPLATE_ID_MAX or not storable(template_id):
        return None
    template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)
    if template is None or not may_run(template, user_id):
        return None
    return template


async def require_runnable(
    core: Shared, *, user_id: str, template_ids: list[str], field: str = "templates"
) -> list[WorkflowTemplate]:
    """Each template of `template_ids`, or one 422 `ValidationError` naming `field` (the
    list's own name, `templates`, or a single `template_id`) with every one the user may
    not run (`templates.2`). Used when a key, a schedule or a hook is saved."""
    found: list[WorkflowTemplate] = []
    problems: list[dict[str, str]] = []
    single = field == "template_id"
    for i, template_id in enumerate(template_ids):
        template = await runnable_template(core, user_id=user_id, template_id=template_id)
        if template is None:
            shown = str(template_id)[:80]
            problems.append({"field": field if single else f"{field}.{i}",
                             "problem": f"no template you may run has the template_id '{shown}' "
                                        "(templates are named here by their template_id)"})
        else:
            found.append(template)
    if problems:
        raise ValidationError(f"Invalid {field}: {problems[0]['problem']}.", detail=problems)
    return found
