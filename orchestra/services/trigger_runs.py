"""Runs that a machine or a clock starts (SPEC §11): whether a user may run a template,
and a run stored inside the caller's transaction (a schedule's fire stores its fire
record and its run in one commit, so a crash in between loses or doubles nothing).

A minimal twin of `workflows.start_run`'s checks, kept apart so the triggers that need
it (schedules now; hooks and keys later) share one place.
"""

from __future__ import annotations

from typing import Any

from orchestra.core import Core
from orchestra.db.models import RunStep, WorkflowRun, WorkflowTemplate
from orchestra.engine.language import schemas
from orchestra.engine.vocabulary import RunStatus, StepStatus
from orchestra.errors import ValidationError


async def runnable_template(template_id: str, user_id: str) -> WorkflowTemplate | None:
    """The template if `user_id` may run it (their own, or shared), else None."""
    if not isinstance(template_id, str) or "\x00" in template_id or len(template_id) > 36:
        return None
    template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)
    if template is None or (template.owner_id != user_id and not template.shared):
        return None
    return template


async def require_runnable(template_id: str, user_id: str, *, field: str = "template_id") -> WorkflowTemplate:
    """The template, or 422 naming `field` when the user may not run it (SPEC §11)."""
    template = await runnable_template(template_id, user_id)
    if template is None:
        raise ValidationError.field(field, f"is not a template you may run ('{template_id}')")
    return template


async def checked_input(core: Core, template: WorkflowTemplate, value: Any, *,
                        field: str = "input") -> tuple[str, Any]:
    """(input text, input JSON value) for a run of `template`: under an input_schema any
    JSON value that validates, else text. ValidationError naming `field` otherwise."""
    spec = template.spec or {}
    if "input_schema" in spec:
        problems = await schemas.check(value, spec["input_schema"], root=field,
                                       sandbox=core.engine.request_sandbox)
        if problems:
            raise ValidationError(
                f"The input does not match the template's input_schema: {schemas.describe(problems)}.",
                detail=problems,
            )
        return "", value
    if value is None:
        return "", None
    if not isinstance(value, str):
        raise ValidationError.field(field, "must be a string (this template has no input_schema)")
    return value, None


async def store_run(*, owner_id: str, template: WorkflowTemplate, input_text: str, input_value: Any,
                    trigger: dict[str, Any] | None) -> WorkflowRun:
    """Insert a `queued` run and its step rows. Call inside a transaction, and hand the
    run to the engine (`core.engine.submit`) after the commit."""
    run = await WorkflowRun.acreate(
        owner=owner_id,
        template=template.id,
        template_name=template.name,
        steps=template.steps,
        spec=template.spec,
        input=input_text,
        input_value=input_value,
        files=[],
        status=RunStatus.QUEUED,
        trigger=trigger,
    )
    if template.steps:
        await WorkflowRun._meta.database.aexecute(RunStep.insert_many([
            {"run": run.trace_id, "step_id": step["id"], "path": step["id"], "status": StepStatus.PENDING}
            for step in template.steps
        ]))
    return run
