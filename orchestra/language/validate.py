"""Save-time checks of a template (SPEC §4, §7): every problem at once, with its path.

`check_template` needs no store: shapes (through `model.Step`), ids, dependencies and
cycles, expressions (`when`, `{{ }}`, `output`: parse, length, variables, and `steps.X`
only for ancestors X), and JSON Schemas. foreach and loop steps (SPEC §8) are checked
level by level: their inner steps form a graph of their own, see the container's
ancestors and their own, and may use `item`/`index` (inside a foreach) and `loop`
(inside a loop); ids are unique across all levels, which nest three deep at most. Whether a worker id belongs to the owner needs
the store: the template service checks that and adds its problems to these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pydantic

from orchestra.language import expressions, schemas
from orchestra.language.calls import (
    SECRET_REF,
    SECRETS_ONLY_THERE,
    action_of,
    clean_actions,
    http_texts,
    mentions_secrets,
)
from orchestra.language.model import (
    MAX_STEPS,
    NODE_NAMES,
    PROMPT_MAX,
    STEP_ID,
    Step,
    TemplateOptions,
)
from orchestra.language.shape import MAX_DEPTH

Problem = dict[str, str]
AGENT_SHAPE = 'must be {"worker": worker_id}, {"node": name} or {"human": true}'
# Variables a top-level step may use; foreach/loop bodies (loops issue) add item, index, loop.
STEP_VARIABLES = frozenset({"input", "steps"})


@dataclass
class Checked:
    """A template's steps and options as they are stored, and every problem found."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    # (field, worker id or name, the step's agent dict): looked up by the caller, which
    # writes the worker's id into the agent when the template named it
    workers: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    # (field, secret name, the step's URL template) of every `{{ secrets.NAME }}`: the
    # caller checks each may go to the host that URL writes (services/secrets.py)
    secrets: list[tuple[str, str, str]] = field(default_factory=list)
    # (field, template id or name, the step's workflow dict): the caller resolves each to
    # a template the owner may run, writes its id, and checks depth and self-calls
    children: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

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
        resolved = {"worker": value}
        checked.workers.append((f"{where}.worker", value, resolved))  # an id or a name: see services
        return resolved
    checked.add(where, AGENT_SHAPE)
    return None


_PLACEHOLDER_STEPS = [{"id": "inner", "agent": {"human": True}, "prompt": "checked on their own"}]


def _container_shape(raw: dict[str, Any], where: str, checked: Checked) -> bool:
    """A foreach or loop step's own fields make sense together (problems added)."""
    ok = True
    if raw.get("foreach") is not None and raw.get("loop") is not None:
        checked.add(where, "is either a foreach or a loop, not both")
        return False
    if raw.get("loop") is not None:
        for name in ("agent", "prompt", "steps", "output"):
            if name in raw:
                checked.add(f"{where}.{name}", "is not a loop step's field (a loop has loop.steps)")
                ok = False
    elif "steps" in raw:
        for name in ("agent", "prompt", "http", "workflow", "code"):
            if name in raw:
                checked.add(f"{where}.{name}", "a foreach has either agent and prompt, http, workflow, code, or steps")
                ok = False
    else:
        if "output" in raw:
            checked.add(f"{where}.output", "is for a foreach with steps")
            ok = False
    return ok


def _clean_step(raw: Any, where: str, checked: Checked, depth: int = 0,
                seen: set[str] | None = None) -> dict[str, Any] | None:
    """The step as stored (only the fields given, v1 ones always), or None when its shape
    is wrong (problems added). A container's inner steps are cleaned here too."""
    if not isinstance(raw, dict):
        checked.add(where, "must be an object {id, agent, prompt, depends_on, …}")
        return None
    container = raw.get("foreach") is not None or raw.get("loop") is not None
    if container:
        return _clean_container(raw, where, checked, depth, seen if seen is not None else set())
    if "steps" in raw or "output" in raw:
        checked.add(where, "steps and output belong to a foreach step")
        return None
    if any(raw.get(name) is not None for name in ("http", "workflow", "code")):
        return _clean_action(raw, where, checked)
    agent = _check_agent(raw.get("agent"), f"{where}.agent", checked)
    try:  # the agent is checked above, in words of its own
        step = Step.model_validate({**raw, "agent": {"human": True}, "depends_on": raw.get("depends_on") or []})
    except pydantic.ValidationError as exc:
        _pydantic_problems(checked, where, exc)
        return None
    if step.prompt is None:
        checked.add(f"{where}.prompt", FIELD_WORDS["prompt"])
        return None
    if agent is None:
        return None
    clean: dict[str, Any] = {
        "id": step.id,
        "agent": agent,
        "prompt": step.prompt,
        "depends_on": list(dict.fromkeys(step.depends_on or [])),
    }
    _policies(step, clean)
    return clean


def _clean_action(raw: dict[str, Any], where: str, checked: Checked) -> dict[str, Any] | None:
    """An http, workflow or code step as stored, or None (problems added)."""
    if action_of(raw, where, checked) is None:
        return None
    try:
        step = Step.model_validate({**raw, "depends_on": raw.get("depends_on") or []})
    except pydantic.ValidationError as exc:
        _pydantic_problems(checked, where, exc)
        return None
    clean: dict[str, Any] = {"id": step.id, "depends_on": list(dict.fromkeys(step.depends_on or []))}
    clean_actions(step, clean, checked, where)
    _policies(step, clean)
    return clean


def _clean_container(raw: dict[str, Any], where: str, checked: Checked, depth: int,
                     seen: set[str]) -> dict[str, Any] | None:
    """A foreach or loop step as stored, its inner steps checked level by level."""
    if depth >= MAX_DEPTH:
        checked.add(where, f"foreach and loop nest three levels deep at most; this one is level {depth + 1}")
        return None
    if not _container_shape(raw, where, checked):
        return None
    is_loop = raw.get("loop") is not None
    inner_raw = (raw["loop"].get("steps") if isinstance(raw["loop"], dict) else None) if is_loop else raw.get("steps")
    action = not is_loop and "steps" not in raw and any(raw.get(name) is not None for name in ("http", "workflow", "code"))
    if action and action_of(raw, where, checked) is None:
        return None
    probe, agent = _container_probe(raw, where, checked, is_loop, action)
    try:
        step = Step.model_validate(probe)
    except pydantic.ValidationError as exc:
        _pydantic_problems(checked, where, exc)
        step = None
    inner_where = f"{where}.loop.steps" if is_loop else f"{where}.steps"
    inner: list[dict[str, Any]] | None = None
    if isinstance(inner_raw, list) and inner_raw:
        inner = _check_level(inner_raw, inner_where, checked, depth + 1, seen)
    if step is None:
        return None
    if not is_loop and "steps" not in raw and not action and step.prompt is None:
        checked.add(f"{where}.prompt", "a foreach needs agent and prompt, or steps")
        return None
    clean = _stored_container(step, raw, is_loop, inner, agent)
    if clean is not None and action:
        clean_actions(step, clean, checked, where)
    if clean is not None:
        _policies(step, clean)
    return clean


def _container_probe(raw: dict[str, Any], where: str, checked: Checked,
                     is_loop: bool, action: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What `Step` validates of a container (its inner steps stand in as a placeholder:
    they are checked level by level), and a foreach's own agent, checked."""
    probe = {**raw, "depends_on": raw.get("depends_on") or []}
    agent = None
    if is_loop:
        if isinstance(raw["loop"], dict):
            probe["loop"] = {**raw["loop"], "steps": _PLACEHOLDER_STEPS} if "steps" in raw["loop"] else raw["loop"]
    elif "steps" in raw:
        probe["steps"] = _PLACEHOLDER_STEPS
    elif not action:  # an http or workflow call per item is checked by Step itself
        agent = _check_agent(raw.get("agent"), f"{where}.agent", checked)
        probe["agent"] = {"human": True}
    return probe, agent


def _stored_container(step: Step, raw: dict[str, Any], is_loop: bool,
                      inner: list[dict[str, Any]] | None,
                      agent: dict[str, Any] | None) -> dict[str, Any] | None:
    """A valid container as stored (without its §7 fields), or None when a part of it
    (its inner steps, its agent) had a problem."""
    clean: dict[str, Any] = {"id": step.id, "depends_on": list(dict.fromkeys(step.depends_on or []))}
    if is_loop:
        if inner is None:
            return None
        loop = step.loop
        clean["loop"] = {"steps": inner, "until": loop.until, "max_iterations": loop.max_iterations}
        if loop.output is not None:
            clean["loop"]["output"] = loop.output
        return clean
    clean["foreach"] = step.foreach.model_dump()
    if "steps" in raw:
        if inner is None:
            return None
        clean["steps"] = inner
        if step.output is not None:
            clean["output"] = step.output
        return clean
    if step.http is not None or step.workflow is not None or step.code is not None:
        return clean  # its call is added by the caller (_clean_actions)
    if agent is None:
        return None
    clean["agent"], clean["prompt"] = agent, step.prompt
    return clean


def _policies(step: Step, clean: dict[str, Any]) -> None:
    """The §7 fields of a step, as stored (only those given)."""
    for name in ("when", "output_schema", "timeout_seconds", "on_error"):
        if name in step.model_fields_set and getattr(step, name) is not None:
            clean[name] = getattr(step, name)
    if step.retry is not None:
        clean["retry"] = step.retry.model_dump()
    if step.on_tool_error is not None and step.on_tool_error != "continue":
        clean["on_tool_error"] = step.on_tool_error  # only what differs from the default is stored
    if step.tools is not None and step.tools.on_tool_error != "continue":
        clean["tools"] = step.tools.model_dump()  # the alias, stored as it was given
    if "default" in step.model_fields_set:
        clean["default"] = step.default
    if clean.get("on_error") == "fail":
        del clean["on_error"]


def check_template(steps: Any, options: dict[str, Any] | None = None) -> Checked:
    """Check a template's steps and options; `Checked.problems` lists every problem."""
    checked = Checked()
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        checked.add("steps", f"must be a list of 1 to {MAX_STEPS} steps")
        return checked
    seen: set[str] = set()
    cleaned = _check_level(steps, "steps", checked, 0, seen)
    _check_options(options or {}, checked)
    _check_language(steps, "steps", cleaned, Visible(frozenset(), STEP_VARIABLES), seen, checked)
    if checked.options.get("output"):
        top = {raw["id"] for raw in steps if isinstance(raw, dict) and isinstance(raw.get("id"), str)}
        _check_expression(checked.options["output"], "output", top, seen, checked)
    checked.steps = [step for step in cleaned if step is not None]
    return checked


@dataclass(frozen=True)
class Visible:
    """What an expression at some level may name: step ids of enclosing levels, variables."""

    outer: frozenset[str]
    variables: frozenset[str]


def _check_level(steps: list[Any], where: str, checked: Checked, depth: int,
                 seen: set[str]) -> list[dict[str, Any] | None]:
    """Shapes and unique ids of one level's steps (and, through containers, of the
    levels below); each step as stored, or None where it has problems."""
    cleaned: list[dict[str, Any] | None] = []
    for i, raw in enumerate(steps):
        if isinstance(raw, dict) and isinstance(raw.get("id"), str) and STEP_ID.fullmatch(raw["id"]):
            if raw["id"] in seen:
                checked.add(f"{where}.{i}.id", f"duplicate step id '{raw['id']}'")
            seen.add(raw["id"])
        cleaned.append(_clean_step(raw, f"{where}.{i}", checked, depth, seen))
    return cleaned


def _check_language(steps: list[Any], where: str, cleaned: list[dict[str, Any] | None],
                    visible: Visible, ids: set[str], checked: Checked) -> None:
    """Dependencies, cycles and expressions of one level, then of the levels below."""
    ancestors = _check_graph(steps, checked, where)
    for i, raw in enumerate(steps):  # also steps with other problems: one 422 names them all
        if not isinstance(raw, dict):
            continue
        step = (cleaned[i] if i < len(cleaned) else None) or _typed_language_fields(raw)
        own = ancestors.get(raw["id"], set()) if isinstance(raw.get("id"), str) else set()
        here = Visible(visible.outer | own, visible.variables)
        _check_step_language(f"{where}.{i}", step, here, ids, checked)
        _check_container_language(f"{where}.{i}", raw, step, here, ids, checked)


def _check_container_language(where: str, raw: dict[str, Any], step: dict[str, Any],
                              visible: Visible, ids: set[str], checked: Checked) -> None:
    foreach, loop = raw.get("foreach"), raw.get("loop")
    if isinstance(foreach, dict):
        if isinstance(foreach.get("items"), str):
            _check_expression(foreach["items"], f"{where}.foreach.items", set(visible.outer), ids, checked,
                              allowed=visible.variables)
        inside = Visible(visible.outer, visible.variables | {"item", "index"})
        inner_raw = raw.get("steps")
        if isinstance(inner_raw, list) and inner_raw:
            _check_language(inner_raw, f"{where}.steps", step.get("steps") or [], inside, ids, checked)
            if isinstance(raw.get("output"), str):
                own = {s["id"] for s in inner_raw if isinstance(s, dict) and isinstance(s.get("id"), str)}
                _check_expression(raw["output"], f"{where}.output", set(visible.outer) | own, ids, checked,
                                  allowed=inside.variables)
    elif isinstance(loop, dict):
        inside = Visible(visible.outer, visible.variables | {"loop"})
        inner_raw = loop.get("steps")
        if isinstance(inner_raw, list) and inner_raw:
            stored = (step.get("loop") or {}).get("steps") or []
            _check_language(inner_raw, f"{where}.loop.steps", stored, inside, ids, checked)
            own = {s["id"] for s in inner_raw if isinstance(s, dict) and isinstance(s.get("id"), str)}
            for name in ("until", "output"):
                if isinstance(loop.get(name), str):
                    _check_expression(loop[name], f"{where}.loop.{name}", set(visible.outer) | own, ids,
                                      checked, allowed=inside.variables)


def _typed_language_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The expression and schema fields of a step whose shape has other problems."""
    partial: dict[str, Any] = {"prompt": raw["prompt"] if isinstance(raw.get("prompt"), str) else ""}
    for name in ("steps", "loop"):  # a container's inner levels are checked on their own
        if name in raw:
            partial[name] = []
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
    for name in ("input_schema", "output_schema"):
        schema = options.get(name)
        if isinstance(schema, dict):
            for sub, problem in schemas.check_schema(schema):
                checked.add(".".join(p for p in (name, sub) if p), problem)
    if parsed is None:
        if isinstance(options.get("output"), str):
            checked.options = {"output": options["output"]}
        return
    checked.options = _clean_options(parsed)


def _clean_options(parsed: TemplateOptions) -> dict[str, Any]:
    """The options as stored: only what was set (an `expose` with nothing on is none)."""
    clean: dict[str, Any] = {}
    if parsed.input_schema is not None:
        clean["input_schema"] = parsed.input_schema
    if parsed.limits is not None:
        limits = parsed.limits.model_dump(exclude_none=True)
        if limits:
            clean["limits"] = limits
    if parsed.output is not None:
        clean["output"] = parsed.output
    if parsed.output_schema is not None:
        clean["output_schema"] = parsed.output_schema
    if parsed.expose is not None and parsed.expose.mcp:
        clean["expose"] = {"mcp": True}
    return clean


def _check_graph(steps: list[Any], checked: Checked, where: str = "steps") -> dict[str, set[str]]:
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
                checked.add(f"{where}.{i}.depends_on", f"unknown step '{dep}'")
            elif dep == sid:
                checked.add(f"{where}.{i}.depends_on", f"step '{dep}' depends on itself")
            else:
                known.append(dep)
        if isinstance(sid, str) and sid not in deps:
            ids.append(sid)
            deps[sid] = known
    cycle = _find_cycle(deps)
    if cycle:
        checked.add(where, f"the steps form a cycle: {' -> '.join(cycle)}")
    return {sid: _ancestors(sid, deps) for sid in ids}


def _check_expression(source: str, where: str, visible: set[str], ids: set[str],
                      checked: Checked, *, placeholder: bool = False,
                      allowed: frozenset[str] = STEP_VARIABLES) -> None:
    if mentions_secrets(source):
        checked.add(where, SECRETS_ONLY_THERE)
        return
    legacy = expressions.LEGACY.match(source) if placeholder else None
    if legacy:
        refs: tuple[str, ...] = (legacy.group(1),) if legacy.group(1) else ()
    else:
        compiled, problems = expressions.check(source, allowed=allowed)
        if placeholder and compiled is not None and problems and "unknown variable" in problems[0]:
            problems = [
                f"unknown placeholder {{{{{source}}}}}; use {{{{input}}}}, {{{{steps.<id>.output}}}} "
                "or a CEL expression over "
                + ("input and steps" if allowed == STEP_VARIABLES else ", ".join(sorted(allowed)))
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


def _check_http_language(where: str, http: dict[str, Any], ancestors: set[str], ids: set[str],
                         checked: Checked, allowed: frozenset[str]) -> None:
    """`{{ }}` of an http step: secrets in url and header values, expressions everywhere."""
    for field_path, text, secrets_ok in http_texts(http, where):
        if not isinstance(text, str):
            continue
        for source in expressions.placeholders(text):
            named = SECRET_REF.match(source.strip())
            if named and secrets_ok:
                checked.secrets.append((field_path, named.group(1), http.get("url") or ""))
                continue
            _check_expression(source, field_path, ancestors, ids, checked, placeholder=True, allowed=allowed)


def _check_step_language(where: str, step: dict[str, Any], visible: Visible, ids: set[str],
                         checked: Checked) -> None:
    ancestors, allowed = set(visible.outer), visible.variables
    in_prompt = allowed | {"item", "index"} if "foreach" in step else allowed  # one call per item
    for source in expressions.placeholders(step.get("prompt") or ""):
        _check_expression(source, f"{where}.prompt", ancestors, ids, checked, placeholder=True,
                          allowed=in_prompt)
    if isinstance(step.get("http"), dict):
        _check_http_language(where, step["http"], ancestors, ids, checked, in_prompt)
    if isinstance(step.get("workflow"), dict) and isinstance(step["workflow"].get("input"), str):
        _check_expression(step["workflow"]["input"], f"{where}.workflow.input", ancestors, ids, checked,
                          allowed=in_prompt)
    if "when" in step:
        _check_expression(step["when"], f"{where}.when", ancestors, ids, checked, allowed=allowed)
    schema = step.get("output_schema")
    if schema is not None:
        schema_problems = schemas.check_schema(schema)
        for sub, problem in schema_problems:
            checked.add(".".join(p for p in (f"{where}.output_schema", sub) if p), problem)
    else:
        schema_problems = []
    _check_default(where, step, schema, schema_problems, checked)


def _check_default(where: str, step: dict[str, Any], schema: Any, schema_problems: list,
                   checked: Checked) -> None:
    """A human step's `default`: it needs timeout_seconds and must fit output_schema."""
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
