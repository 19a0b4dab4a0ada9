"""A fork's `outputs` checked by the step's kind (SPEC §13, §15b): a value stands for
what the step would have given, so it has that step's shape.

- an agent or human step: its `output_schema`'s value, or text without one;
- an HTTP step: `{status, headers, body}` (a status 100–399, since a status >= 400 fails
  the step; headers an object of strings; body any JSON value);
- a workflow step: the child run's output: a value of the child template's (or pinned
  version's) `output_schema`, or any JSON value without one;
- a foreach: a list of at most `ORCHESTRA_FOREACH_MAX_ITEMS` items, each what one item
  gives (the inner call's shape, `null` allowed with `on_error: continue`; any JSON
  value for a foreach of `steps`);
- a loop: any JSON value (its `output` expression, or its last step's output).
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import TemplateVersion, WorkflowTemplate
from orchestra.language import schemas, shape
from orchestra.services.shared import Shared

ITEM_PROBLEMS_MAX = 20  # problems listed for one foreach's items


def _problem(field: str, problem: str) -> list[dict[str, str]]:
    return [{"field": field, "problem": problem}]


async def check(core: Shared, step: dict[str, Any], value: Any, field: str) -> list[dict[str, str]]:
    """The problems of `value` as the output of top-level `step`."""
    kind = shape.kind_of(step)
    if kind == "loop":
        return []
    if kind == "foreach":
        return await _foreach(core, step, value, field)
    return await _call(core, step, value, field)


async def _foreach(core: Shared, step: dict[str, Any], value: Any, field: str) -> list[dict[str, str]]:
    limit = core.settings.foreach_max_items
    if not isinstance(value, list):
        return _problem(field, "must be a list (a foreach's output: one result per item)")
    if len(value) > limit:
        return _problem(field, f"has {len(value)} items; a foreach maps at most {limit} "
                               "(ORCHESTRA_FOREACH_MAX_ITEMS)")
    if step.get("steps"):
        return []  # each item's result is its `output` expression's value: any JSON value
    may_be_null = step.get("on_error") == "continue"
    problems: list[dict[str, str]] = []
    for index, item in enumerate(value):
        if len(problems) >= ITEM_PROBLEMS_MAX:
            break
        if item is None and may_be_null:
            continue  # a failed item's result
        problems += await _call(core, step, item, f"{field}.{index}")
    return problems


async def _call(core: Shared, step: dict[str, Any], value: Any, field: str) -> list[dict[str, str]]:
    if isinstance(step.get("http"), dict):
        return _http(value, field)
    if isinstance(step.get("workflow"), dict):
        schema = await _child_schema(core, step["workflow"])
        if schema is None:
            return []  # the child's output: any JSON value
        return await schemas.check(value, schema, root=field, sandbox=core.engine.request_sandbox)
    if "output_schema" in step:
        return await schemas.check(value, step["output_schema"], root=field,
                                   sandbox=core.engine.request_sandbox)
    if not isinstance(value, str):
        return _problem(field, "must be text (this step has no output_schema)")
    return []


def _http(value: Any, field: str) -> list[dict[str, str]]:
    shape = "an HTTP step's output is {status, headers, body}"
    if not isinstance(value, dict):
        return _problem(field, f"must be an object ({shape})")
    problems: list[dict[str, str]] = []
    for key in sorted(set(value) - {"status", "headers", "body"})[:5]:
        problems += _problem(f"{field}.{key[:64]}", f"is not a field of {shape}")
    for key in ("status", "headers", "body"):
        if key not in value:
            problems += _problem(f"{field}.{key}", f"is required ({shape})")
    status = value.get("status")
    if "status" in value and not (isinstance(status, int) and not isinstance(status, bool)
                                  and 100 <= status <= 399):
        problems += _problem(f"{field}.status", "must be an integer from 100 to 399 "
                                                "(a status of 400 or more fails the step)")
    headers = value.get("headers")
    if "headers" in value and not (isinstance(headers, dict)
                                   and all(isinstance(v, str) for v in headers.values())):
        problems += _problem(f"{field}.headers", "must be an object of strings (header name: value)")
    return problems


async def _child_schema(core: Shared, flow: dict[str, Any]) -> Any:
    """The `output_schema` of what the workflow step's child runs (its pinned version's,
    else its template's latest); None when it has none or is gone."""
    template_id, version = flow.get("template"), flow.get("version")
    if not isinstance(template_id, str):
        return None
    if isinstance(version, int):
        row = await TemplateVersion.aget_or_none((TemplateVersion.template == template_id)
                                                 & (TemplateVersion.version == version))
    else:
        row = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)
    if row is None:
        return None
    return (row.spec or {}).get("output_schema")
