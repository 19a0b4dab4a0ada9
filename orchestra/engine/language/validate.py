"""Save-time checks of a template (SPEC §4, §7): every problem at once, with its path.

`check_template` needs no store: shapes (through `model.Step`), ids, dependencies and
cycles, expressions (`when`, `{{ }}`, `output`: parse, length, variables, and `steps.X`
only for ancestors X), and JSON Schemas. Whether a worker id belongs to the owner needs
the store: the template service checks that and adds its problems to these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pydantic

from orchestra.engine.language import expressions, schemas
from orchestra.engine.language.model import (
    MAX_STEPS,
    NODE_NAMES,
    PROMPT_MAX,
    STEP_ID,
    Step,
    TemplateOptions,
)

Problem = dict[str, str]
AGENT_SHAPE = 'must be {"worker": worker_id}, {"node": name} or {"human": true}'
STEP_FIELDS = tuple(Step.model_fields)
# Variables a top-level step may use; foreach/loop bodies (loops issue) add item, index, loop.
STEP_VARIABLES = frozenset({"input", "steps"})


@dataclass
class Checked:
    """A template's steps and options as they are stored, and every problem found."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    workers: list[tuple[str, str]] = field(default_factory=list)  # (field, worker id) to look up

    def add(self, where: str, problem: str) -> None:
        self.problems.append({"field": where, "problem": problem})


FIELD_WORDS = {  # the v1 wording of the commonest problems (clients and tests read it)
    "id": "must be 1 to 64 letters, digits, '_' or '-'",
    "prompt": "must be a non-empty string",
    "depends_on": "must be a list of step ids",
}


def _pydantic_problems(checked: Checked, where: str, error: pydantic.ValidationError) -> None:
    for err in error.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            checked.add(f"{where}.{loc[0]}", "is not a step field")
        elif loc and loc[0] == "prompt" and err["type"] == "string_too_long":
            checked.add(f"{where}.prompt", f"must be at most {PROMPT_MAX} characters long")
        elif loc and loc[0] in FIELD_WORDS:
            checked.add(f"{where}.{loc[0]}", FIELD_WORDS[loc[0]])
        else:
            checked.add(".".join([where, *loc]), err["msg"])


def _check_agent(agent: Any, where: str, checked: Checked) -> dict[str, Any] | None:
    """The agent as stored, or None (problem added). Worker ownership is the service's."""
    if not isinstance(agent, dict) or len(agent) != 1:
        checked.add(where, AGENT_SHAPE)
        return None
    (kind, value), = agent.items()
    if kind == "human":
        if value is not True:
            checked.add(where, AGENT_SHAPE)
            return None
        return {"human": True}
    if kind == "node":
        if not isinstance(value, str) or value not in NODE_NAMES:
            checked.add(f"{where}.node", f"unknown system node {value!r}; nodes: {', '.join(NODE_NAMES)}")
            return None
        return {"node": value}
    if kind == "worker":
        if not isinstance(value, str) or not value:
            checked.add(f"{where}.worker", f"unknown worker {value!r} (not one of yours)")
            return None
        checked.workers.append((f"{where}.worker", value))
        return {"worker": value}
    checked.add(where, AGENT_SHAPE)
    return None


def _clean_step(raw: Any, i: int, checked: Checked) -> dict[str, Any] | None:
    """The step as stored (only the fields given, v1 ones always), or None when its shape
    is wrong (problems added)."""
    where = f"steps.{i}"
    if not isinstance(raw, dict):
        checked.add(where, "must be an object {id, agent, prompt, depends_on, …}")
        return None
    agent = _check_agent(raw.get("agent"), f"{where}.agent", checked)
    try:  # the agent is checked above, in words of its own
        step = Step.model_validate({**raw, "agent": {"human": True}, "depends_on": raw.get("depends_on") or []})
    except pydantic.ValidationError as exc:
        _pydantic_problems(checked, where, exc)
        return None
    if agent is None:
        return None
    clean: dict[str, Any] = {
        "id": step.id,
        "agent": agent,
        "prompt": step.prompt,
        "depends_on": list(dict.fromkeys(step.depends_on or [])),
    }
    for name in ("when", "output_schema", "timeout_seconds", "on_error"):
        if name in step.model_fields_set and getattr(step, name) is not None:
            clean[name] = getattr(step, name)
    if step.retry is not None:
        clean["retry"] = step.retry.model_dump()
    if "default" in step.model_fields_set:
        clean["default"] = step.default
    if clean.get("on_error") == "fail":
        del clean["on_error"]
    return clean


def check_template(steps: Any, options: dict[str, Any] | None = None) -> Checked:
    """Check a template's steps and options; `Checked.problems` lists every problem."""
    checked = Checked()
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        checked.add("steps", f"must be a list of 1 to {MAX_STEPS} steps")
        return checked
    cleaned: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()
    for i, raw in enumerate(steps):
        if isinstance(raw, dict) and isinstance(raw.get("id"), str) and STEP_ID.fullmatch(raw["id"]):
            if raw["id"] in seen:
                checked.add(f"steps.{i}.id", f"duplicate step id '{raw['id']}'")
            seen.add(raw["id"])
        step = _clean_step(raw, i, checked)
        if step is not None:
            cleaned.append((i, step))
    _check_options(options or {}, checked)
    ancestors = _check_graph(steps, checked)
    clean_at = dict(cleaned)
    for i, raw in enumerate(steps):  # also steps with other problems: one 422 names them all
        if not isinstance(raw, dict):
            continue
        step = clean_at.get(i) or _typed_language_fields(raw)
        own = ancestors.get(raw["id"], set()) if isinstance(raw.get("id"), str) else set()
        _check_step_language(i, step, own, seen, checked)
    if checked.options.get("output"):
        _check_expression(checked.options["output"], "output", seen, seen, checked)
    checked.steps = [step for _, step in cleaned]
    return checked


def _typed_language_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The expression and schema fields of a step whose shape has other problems."""
    partial: dict[str, Any] = {"prompt": raw["prompt"] if isinstance(raw.get("prompt"), str) else ""}
    if isinstance(raw.get("when"), str):
        partial["when"] = raw["when"]
    if isinstance(raw.get("output_schema"), dict):
        partial["output_schema"] = raw["output_schema"]
    return partial


def _check_options(options: dict[str, Any], checked: Checked) -> None:
    parsed: TemplateOptions | None = None
    try:
        parsed = TemplateOptions.model_validate(options)
    except pydantic.ValidationError as exc:
        for err in exc.errors(include_url=False):
            checked.add(".".join(str(p) for p in err["loc"]), err["msg"])
    schema = options.get("input_schema")
    if isinstance(schema, dict):
        for sub, problem in schemas.check_schema(schema):
            checked.add(".".join(p for p in ("input_schema", sub) if p), problem)
    if parsed is None:
        if isinstance(options.get("output"), str):
            checked.options = {"output": options["output"]}
        return
    clean: dict[str, Any] = {}
    if parsed.input_schema is not None:
        clean["input_schema"] = parsed.input_schema
    if parsed.limits is not None:
        limits = parsed.limits.model_dump(exclude_none=True)
        if limits:
            clean["limits"] = limits
    if parsed.output is not None:
        clean["output"] = parsed.output
    checked.options = clean


def _check_graph(steps: list[Any], checked: Checked) -> dict[str, set[str]]:
    """Unknown dependencies and cycles; each valid step id's ancestors."""
    ids: list[str] = []
    deps: dict[str, list[str]] = {}
    for i, raw in enumerate(steps):
        if not isinstance(raw, dict):
            continue
        sid = raw.get("id")
        depends = raw.get("depends_on") or []
        if not isinstance(depends, list):
            continue
        known = []
        for dep in depends:
            if not isinstance(dep, str):
                continue
            if not any(isinstance(s, dict) and s.get("id") == dep for s in steps):
                checked.add(f"steps.{i}.depends_on", f"unknown step '{dep}'")
            elif dep == sid:
                checked.add(f"steps.{i}.depends_on", f"step '{dep}' depends on itself")
            else:
                known.append(dep)
        if isinstance(sid, str) and sid not in deps:
            ids.append(sid)
            deps[sid] = known
    cycle = _find_cycle(deps)
    if cycle:
        checked.add("steps", f"the steps form a cycle: {' -> '.join(cycle)}")
    return {sid: _ancestors(sid, deps) for sid in ids}


def _check_expression(source: str, where: str, visible: set[str], ids: set[str],
                      checked: Checked, *, placeholder: bool = False) -> None:
    legacy = expressions.LEGACY.match(source) if placeholder else None
    if legacy:
        refs: tuple[str, ...] = (legacy.group(1),) if legacy.group(1) else ()
    else:
        compiled, problems = expressions.check(source, allowed=STEP_VARIABLES)
        if placeholder and compiled is not None and problems:
            problems = [
                f"unknown placeholder {{{{{source}}}}}; use {{{{input}}}}, {{{{steps.<id>.output}}}} "
                "or a CEL expression over input and steps"
            ]
        for problem in problems:
            checked.add(where, problem)
        if compiled is None:
            return
        refs = compiled.step_refs
    shown = f"{{{{{source}}}}}" if placeholder else f"`{source[:120]}`"
    for ref in refs:
        if ref not in ids:
            checked.add(where, f"{shown} names unknown step '{ref}'")
        elif ref not in visible:
            checked.add(where, f"{shown} needs step '{ref}' in depends_on (directly or transitively)")


def _check_step_language(i: int, step: dict[str, Any], ancestors: set[str], ids: set[str],
                         checked: Checked) -> None:
    where = f"steps.{i}"
    for source in expressions.placeholders(step["prompt"]):
        _check_expression(source, f"{where}.prompt", ancestors, ids, checked, placeholder=True)
    if "when" in step:
        _check_expression(step["when"], f"{where}.when", ancestors, ids, checked)
    schema = step.get("output_schema")
    if schema is not None:
        schema_problems = schemas.check_schema(schema)
        for sub, problem in schema_problems:
            checked.add(".".join(p for p in (f"{where}.output_schema", sub) if p), problem)
    else:
        schema_problems = []
    human = "human" in step.get("agent", {})
    if "default" in step and "agent" in step:
        if not human:
            checked.add(f"{where}.default", "is for human steps only")
        elif "timeout_seconds" not in step:
            checked.add(f"{where}.default", "needs timeout_seconds (it is the output after a timeout)")
        elif schema is not None and not schema_problems:
            for v in schemas.violations(step["default"], schema, root=f"{where}.default"):
                checked.add(v["field"], f"does not match output_schema: {v['problem']}")
        elif schema is None and not isinstance(step["default"], str):
            checked.add(f"{where}.default", "must be a string (a reply) unless output_schema is set")


def _find_cycle(deps: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in deps.get(node, []):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _ancestors(step_id: str, deps: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    stack = list(deps.get(step_id, []))
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(deps.get(node, []))
    return seen
