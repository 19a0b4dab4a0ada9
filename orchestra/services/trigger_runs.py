"""Runs that a clock starts (SPEC §11): the input check of `runs.start_run`, and a
run to store inside the caller's transaction — a schedule's fire stores its fire record
and its run in one commit, so a crash in between loses or doubles nothing (start_run
commits on its own and hands the run to the engine at once). Who may run a template is
`run_access`, the one rule for every way a run starts.
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import WorkflowTemplate
from orchestra.engine.store.creation import NewRun, start_budget
from orchestra.errors import ValidationError
from orchestra.language import schemas
from orchestra.services.shared import Shared


async def checked_input(core: Shared, template: WorkflowTemplate, value: Any, *,
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


def new_run(*, owner_id: str, template: WorkflowTemplate, input_text: str, input_value: Any,
            trigger: dict[str, Any] | None) -> NewRun:
    """A run of the template's latest version, to store inside the caller's transaction
    (`RunStore.create`; hand it to the engine after the commit)."""
    return NewRun(
        owner_id=owner_id, template_id=template.id, template_name=template.name,
        template_version=getattr(template, "version", None), steps=template.steps, spec=template.spec,
        input_text=input_text, input_value=input_value, trigger=trigger,
        budget_pusd=start_budget(template.spec, None),  # the template's limits.budget_usd (SPEC §12)
        workspace_id=template.workspace_id,  # a run belongs to its template's workspace (SPEC §16)
    )
