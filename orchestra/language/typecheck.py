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

from collections.abc import Iterator
from typing import Any

import cel

from orchestra.language.examples import schema_example
from orchestra.language.expressions import (
    LEGACY,
    ExpressionError,
    compile_expression,
    placeholders,
)
from orchestra.language.shape import walk
from orchestra.vocabulary import StepStatus

MISFIT = ("its operands do not fit the operation for values of the declared schemas (CEL "
          "converts nothing: compare a number with a number, e.g. 4 not '4')")


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


def output_example(step: dict[str, Any]) -> Any:
    """What a step's output looks like: its output_schema's example, an HTTP answer's
    known fields, else text."""
    if "output_schema" in step:
        return schema_example(step["output_schema"])
    if "http" in step and "foreach" not in step:
        return {"status": 200, "headers": {}}
    return "text"


def type_problems(steps: list[dict[str, Any]], options: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, problem) for each top-level expression that fails on its declared types."""
    schema = options.get("input_schema")
    values = {
        "input": schema_example(schema) if schema is not None else "text",
        "steps": {s["id"]: {"output": output_example(s), "status": StepStatus.SUCCEEDED}
                  for s, _depth, _where in walk(steps) if isinstance(s.get("id"), str)},
    }
    # A child run's output (SPEC §14) or a code step's (§17) has no declared type here: expressions naming one
    # are left to run time, as are those over a foreach of http or workflow calls.
    unknown = {s["id"] for s, _depth, _where in walk(steps) if isinstance(s.get("id"), str)
               and "output_schema" not in s
               and ("workflow" in s or "code" in s or ("foreach" in s and "http" in s))}
    found = []
    for where, source in _sites(steps, options):
        try:
            compiled = compile_expression(source)
        except ExpressionError:
            continue  # the language check reports it
        # A comprehension may iterate over what it is given: left to run time (bounded there).
        if compiled.macros or compiled.variables - {"input", "steps"}:
            continue
        if "steps" in compiled.variables and (compiled.all_steps or unknown & set(compiled.step_refs)):
            continue
        try:
            compiled.program.execute(cel.Context({k: v for k, v in values.items() if k in compiled.variables}))
        except TypeError as exc:
            if "No such overload" in str(exc):
                found.append((where, f"expression `{source[:120]}`: {MISFIT}"))
        except Exception:  # noqa: BLE001, S112 - a missing optional field, a division by zero: run-time matters
            continue
    return found
