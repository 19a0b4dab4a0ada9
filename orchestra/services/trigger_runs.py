"""Runs that a clock starts (SPEC §11): the input check of `workflows.start_run`, and a
run stored inside the caller's transaction — a schedule's fire stores its fire record
and its run in one commit, so a crash in between loses or doubles nothing (start_run
commits on its own and hands the run to the engine at once). Who may run a template is
`run_access`, the one rule for every way a run starts.
"""

from __future__ import annotations

from typing import Any

from orchestra.core import Core
from orchestra.db.models import RunStep, WorkflowRun, WorkflowTemplate
from orchestra.engine.language import schemas
from orchestra.engine.vocabulary import RunStatus, StepStatus
from orchestra.errors import ValidationError


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
