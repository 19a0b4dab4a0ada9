"""Who may run which template: one rule for every way a run starts (a person's
`POST /run`, an API key, a schedule, a webhook), so that keys, schedules and hooks
check at creation exactly what a start checks later.

A user may run a template they own or one marked `shared` (SPEC §3, §4); being an
administrator does not open another user's private template. A template of a team
workspace is run by its members of role `runner` and above (SPEC §16,
services/workspace_rights.py), checked at the moment of use: a schedule or hook whose
owner was demoted or removed starts nothing. A key, schedule, hook or subscription names
templates of its own workspace only (or shared ones): another workspace's is the same 422
as one that does not exist.
"""

from __future__ import annotations

from orchestra.db.models import WorkflowTemplate, storable
from orchestra.errors import ValidationError
from orchestra.services import workspace_scope
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action, allows

TEMPLATE_ID_MAX = 36


async def may_run(core: Shared, template: WorkflowTemplate, user_id: str) -> bool:
    """Whether `user_id` may start runs of `template` now: a shared one, their own, or
    one of a team workspace where their role has the right to run."""
    if template.shared:
        return True
    team = await workspace_scope.team(core, template.workspace_id)
    if team is None:
        return template.owner_id == user_id
    role = await workspace_scope.role_in(core, user_id, team.id)
    return role is not None and allows(role, Action.RUN)


async def runnable_template(core: Shared, *, user_id: str, template_id: str,
                            workspace_id: str | None = None) -> WorkflowTemplate | None:
    """The template when `user_id` may run it (and, with `workspace_id`, it is of that
    workspace or shared); None when it does not exist or they may not."""
    if not isinstance(template_id, str) or len(template_id) > TEMPLATE_ID_MAX or not storable(template_id):
        return None
    template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)
    if template is None or not await may_run(core, template, user_id):
        return None
    elsewhere = workspace_id is not None and not template.shared
    if elsewhere and await workspace_scope.workspace_of_template(core, template) != workspace_id:
        return None
    return template


async def require_runnable(
    core: Shared, *, user_id: str, template_ids: list[str], field: str = "templates",
    workspace_id: str | None = None,
) -> list[WorkflowTemplate]:
    """Each template of `template_ids`, or one 422 `ValidationError` naming `field` (the
    list's own name, `templates`, or a single `template_id`) with every one the user may
    not run (`templates.2`) or that is of a workspace other than `workspace_id` (the
    saved resource's; a shared template is every workspace's). Used when a key, a
    schedule, a hook or a subscription is saved."""
    found: list[WorkflowTemplate] = []
    problems: list[dict[str, str]] = []
    single = field == "template_id"
    for i, template_id in enumerate(template_ids):
        template = await runnable_template(core, user_id=user_id, template_id=template_id,
                                           workspace_id=workspace_id)
        if template is None:
            shown = str(template_id)[:80]
            problems.append({"field": field if single else f"{field}.{i}",
                             "problem": f"no template you may run has the template_id '{shown}' "
                                        "(templates are named here by their template_id)"
                                        + (" in this workspace" if workspace_id else "")})
        else:
            found.append(template)
    if problems:
        raise ValidationError(f"Invalid {field}: {problems[0]['problem']}.", detail=problems)
    return found
