"""The structural diff of two template versions (SPEC §13), a pure function.

Steps are matched by id across the whole template: inner steps of foreach and loop are
listed by their own ids like top-level ones. A step's `fields` are its own top-level
keys whose values differ (a key present on one side only counts); a container's inner
steps are not among its own keys (`steps` of a foreach, `loop.steps` of a loop), so a
container is listed only when something of its own changed. `template_fields` are the
changed top-level names of the template (name, description, input_schema, limits,
output, output_schema, expose), never `steps`.
"""

from __future__ import annotations

from typing import Any

from orchestra.language import shape

TEMPLATE_FIELDS = ("name", "description", "input_schema", "limits", "output", "output_schema", "expose")


def own_keys(step: dict[str, Any]) -> dict[str, Any]:
    """A step's own top-level keys: without the inner steps of a container."""
    own = dict(step)
    if step.get("foreach") is not None:
        own.pop("steps", None)
    if isinstance(step.get("loop"), dict):
        own["loop"] = {k: v for k, v in step["loop"].items() if k != "steps"}
    return own


def steps_by_id(steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every step of a template by id, inner ones included, in walk order."""
    return {step["id"]: step for step, _depth, _where in shape.walk(steps or []) if "id" in step}


def changed_fields(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The names of the keys whose values differ (present on one side only included)."""
    return sorted(k for k in old.keys() | new.keys() if k not in old or k not in new or old[k] != new[k])


def content_fields(content: dict[str, Any]) -> dict[str, Any]:
    """A version's template-level fields that the diff compares."""
    spec = content.get("spec") or {}
    fields = {"name": content.get("name"), "description": content.get("description") or ""}
    fields.update({k: spec[k] for k in TEMPLATE_FIELDS if k in spec})
    return fields


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`{added, removed, changed: [{step_id, fields}], template_fields}` from `old` to
    `new`, each a version's content `{name, description, steps, spec}`."""
    before, after = steps_by_id(old.get("steps")), steps_by_id(new.get("steps"))
    changed = []
    for sid, step in after.items():
        if sid in before:
            fields = changed_fields(own_keys(before[sid]), own_keys(step))
            if fields:
                changed.append({"step_id": sid, "fields": fields})
    return {
        "added": [sid for sid in after if sid not in before],
        "removed": [sid for sid in before if sid not in after],
        "changed": changed,
        "template_fields": changed_fields(content_fields(old), content_fields(new)),
    }
