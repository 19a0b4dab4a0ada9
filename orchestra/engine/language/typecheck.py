"""A save-time dry run of a template's expressions against values of its declared types.

CEL converts nothing: `steps.classify.output.urgency >= '4'` compares a number with a
string and fails at run time, after the steps before it were paid for. Here each
expression of the top level (a step's `when`, its prompt's `{{ }}`, a foreach's
`items`, the template's `output`) is evaluated once against an example of what it will
see — the input's example under `input_schema` (else text), each step's output example
under its `output_schema` (else text) — and a type error becomes a problem at save.

Only what the schemas promise is checked: a missing optional field, a comprehension
(which may iterate and is evaluated at run time, bounded) and expressions that use
`item`, `index` or `loop` (their values are not known here) are passed over.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import cel

from orchestra.engine.language import expressions
from orchestra.engine.language.expressions import LEGACY, compile_expression, placeholders

MAX_DEPTH = 6  # of an example value
# A comprehension may iterate over what it is given: such expressions are left to run
# time (bounded there). Decided on the raw text: a false "yes" only skips a check.
_MACRO = re.compile(r"(?<!\w)(?:all|exists|exists_one|map|filter)(?!\w)")


def example_of(schema: Any, depth: int = 0) -> Any:
    """A small value of `schema`'s shape: const, enum, default, then a stand-in per type
    (required properties only: optional ones may be absent at run time)."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example_of(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
        properties = schema.get("properties") or {}
        return {name: example_of(properties.get(name, {}), depth + 1) for name in schema.get("required") or []
                if isinstance(name, str)}
    if kind == "array":
        return [example_of(schema.get("items"), depth + 1)]
    if kind == "boolean":
        return True
    if kind == "integer":
        low = schema.get("minimum")
        return int(low) if isinstance(low, (int, float)) else 1
    if kind == "number":
        low = schema.get("minimum")
        return float(low) if isinstance(low, (int, float)) else 1.5
    if kind == "null":
        return None
    if kind == "string":
        return "text"
    return None


def _sites(steps: list[dict[str, Any]], options: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, expression) of the top level's expressions."""
    for n, step in enumerate(steps):
        where = f"steps.{n}"
        if isinstance(step.get("when"), str):
            yield f"{where}.when", step["when"]
        if isinstance(step.get("prompt"), str):
            for expr in placeholders(step["prompt"]):
                if not LEGACY.match(expr):
                    yield f"{where}.prompt", expr
        foreach = step.get("foreach")
        if isinstance(foreach, dict) and isinstance(foreach.get("items"), str):
            yield f"{where}.foreach.items", foreach["items"]
    if isinstance(options.get("output"), str):
        yield "output", options["output"]


def _all_steps(steps: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for step in steps:
        yield step
        for key in ("foreach", "loop"):
            inner = step.get(key)
            if isinstance(inner, dict) and isinstance(inner.get("steps"), list):
                yield from _all_steps([s for s in inner["steps"] if isinstance(s, dict)])
        if isinstance(step.get("steps"), list):
            yield from _all_steps([s for s in step["steps"] if isinstance(s, dict)])


def type_problems(steps: list[dict[str, Any]], options: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, problem) for each top-level expression that fails on its declared types."""
    schema = options.get("input_schema")
    values = {
        "input": example_of(schema) if schema is not None else "text",
        "steps": {s["id"]: {"output": example_of(s["output_schema"]) if "output_schema" in s else "text",
                            "status": "succeeded"}
                  for s in _all_steps(steps) if isinstance(s.get("id"), str)},
    }
    found = []
    for where, source in _sites(steps, options):
        try:
            compiled = compile_expression(source)
        except expressions.ExpressionError:
            continue  # the language check reports it
        if _MACRO.search(source):
            continue
        if compiled.variables - {"input", "steps"}:
            continue
        try:
            compiled.program.execute(cel.Context({k: v for k, v in values.items() if k in compiled.variables}))
        except TypeError as exc:
            if "No such overload" in str(exc):
                found.append((where, f"expression `{source[:120]}`: its operands do not fit the operation for "
                                     "values of the declared schemas (CEL converts nothing: compare a number "
                                     "with a number, e.g. 4 not '4')"))
        except Exception:  # noqa: BLE001 - a missing optional field, a division by zero: run-time matters
            continue
    return found
