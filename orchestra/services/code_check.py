"""`template check` runs each code step once on examples of its inputs (SPEC §17): the
input's example from `input_schema` (else the text "text"), each other step's output
from its `output_schema` (an http step's `{status, headers}`, else "text"), and each code
step's output as it computed it here, in dependency order. An exception, or a bound,
is reported on `steps.N.code.source`, as a problem naming the example it ran on. A
foreach of code runs on the first item its `items` give on the examples (its output:
a list of that one result). Saving never runs code: only the check does. Inner steps
of a foreach or a loop are not run here.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from orchestra.db.database import release_connection
from orchestra.engine.code_sandbox import CodeError
from orchestra.language.examples import schema_example
from orchestra.language.expressions import ExpressionError, Scope
from orchestra.language.typecheck import output_example
from orchestra.language.validate import Checked
from orchestra.services.shared import Shared
from orchestra.vocabulary import StepStatus


def _ordered(steps: list[dict[str, Any]]) -> list[int]:
    """The top-level steps' indexes with each after its dependencies (the graph is
    acyclic: the language check has refused a cycle)."""
    index = {s["id"]: i for i, s in enumerate(steps)}
    done: list[int] = []
    seen: set[int] = set()

    def visit(i: int) -> None:
        if i in seen:
            return
        seen.add(i)
        for dep in steps[i].get("depends_on") or []:
            if dep in index:
                visit(index[dep])
        done.append(i)

    for i in range(len(steps)):
        visit(i)
    return done


async def code_problems(core: Shared, checked: Checked) -> list[tuple[str, str]]:
    """(field, problem) for each top-level code step that fails on the examples."""
    steps = checked.steps
    if not any("code" in s for s in steps):
        return []
    schema = checked.options.get("input_schema")
    example_input = schema_example(schema) if schema is not None else "text"
    outputs = {s["id"]: {"output": output_example(s), "status": StepStatus.SUCCEEDED} for s in steps}
    sandbox = core.engine.code_steps.sandbox
    await release_connection(core.db)  # none held while code runs (or waits for a worker)
    now = dt.datetime.now(dt.UTC)
    found = []
    for i in _ordered(steps):
        step = steps[i]
        if "code" not in step:
            continue
        variables: dict[str, Any] = {"input": example_input, "steps": outputs}
        if "foreach" in step:  # its first example item, when its items give one here
            try:
                items = await Scope(dict(variables)).evaluate(step["foreach"]["items"])
            except ExpressionError:
                continue
            if not isinstance(items, list) or not items:
                continue
            variables |= {"item": items[0], "index": 0}
        try:
            value = await sandbox.run(step["code"]["source"], variables, now, step.get("timeout_seconds"))
        except CodeError as exc:
            shown = json.dumps(example_input, ensure_ascii=False)[:120]
            if "item" in variables:
                shown += f", item: {json.dumps(variables['item'], ensure_ascii=False)[:80]}"
            found.append((f"steps.{i}.code.source", f"on example inputs (input: {shown}): {exc.message}"))
            outputs[step["id"]] = {"output": None, "status": StepStatus.FAILED}
            continue
        if "output_schema" not in step:
            outputs[step["id"]]["output"] = [value] if "foreach" in step else value
    return found
