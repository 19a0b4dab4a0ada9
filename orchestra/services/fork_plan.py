"""Which instances of a source run a fork stores as reused before it runs (SPEC §13).

An instance is reused only when it succeeded in the source, its step's definition is the
same in the fork's steps, it is not `from_step` nor downstream of it (`run_again`), and
nothing it reads differs: no step it depends on or names runs again, and every
expression it reads (`when`, the prompt, an HTTP step's URL, headers and body, a
workflow step's input, `foreach.items`, a loop's `until` and `output`) gives the same
value with the fork's input and outputs as it gave in the source (what a step reads is
rendered, not guessed). An agent or human call is the same call only when its reuse key
is (engine/reuse.py: its definition, rendered prompt, files and the worker's or node's
configuration now against what the source's call ran with); a row stored before keys
existed is compared by definition and rendered prompt. A step whose output is set by
the fork's `outputs` is not run; whatever reads it sees the new value.

A foreach's items and a loop's iterations are decided one by one by the same rule: item
`i` is reused when the mapped list gives the same value at `i` and the item's own steps
are reused; iteration `k` when iterations 1…k-1 were reused, the fork's loop goes on
past k-1 (its own `until` and `max_iterations`: changed loop settings keep the
iterations they still run) and its steps are reused. A container whose definition is
unchanged and with everything under it reused is reused itself; otherwise it runs
again, and the engine skips the instances already stored under it.

What a step reads of a step that runs again cannot be known before it runs: such a step
is left to the engine, which decides each call when it is reached, with what it reads
evaluated (engine/reuse.py) — except `from_step` and what is downstream of it, which
always run again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.engine import instances
from orchestra.engine.http_step import secret_names
from orchestra.engine.model import StepDef, step_defs
from orchestra.engine.reuse import agent_fingerprint, call_key, keyed
from orchestra.language import expressions, shape
from orchestra.language.code import step_reads
from orchestra.language.expressions import Scope
from orchestra.services.template_diff import own_keys
from orchestra.vocabulary import StepStatus

SUCCEEDED = StepStatus.SUCCEEDED
_DIFFERENT = object()  # what an expression that fails gives: never equal to anything


@dataclass(frozen=True, slots=True)
class Record:
    """A source instance as a fork reads it."""

    status: str
    output: Any
    key: str | None = None  # its reuse key (agent and human calls stored since keys exist)


@dataclass(frozen=True, slots=True)
class Source:
    """The source run as a fork reads it: its instances by path, its steps by id (inner
    ones included), its input and its attached files."""

    records: dict[str, Record]
    steps: dict[str, dict[str, Any]]
    input: Any
    files: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Plan:
    """Paths of the source instances the fork reuses, in the order they were decided."""

    reused: list[str] = field(default_factory=list)


# -- what a step reads --------------------------------------------------------------------
def _strings(value: Any) -> list[str]:
    """Every string inside a JSON value (an HTTP body)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _templates(step: dict[str, Any]) -> list[str]:
    """The texts of a step rendered with `{{ }}`: its prompt, an HTTP step's URL, header
    values and body."""
    http = step.get("http") if isinstance(step.get("http"), dict) else {}
    texts = [step.get("prompt"), http.get("url"), *(http.get("headers") or {}).values(), *_strings(http.get("body"))]
    return [text for text in texts if isinstance(text, str)]


def _expressions(step: dict[str, Any]) -> list[str]:
    """The CEL expressions of a step's own keys."""
    loop = step.get("loop") if isinstance(step.get("loop"), dict) else {}
    workflow = step.get("workflow") if isinstance(step.get("workflow"), dict) else {}
    values = (step.get("when"), step.get("output") if step.get("foreach") is not None else None,
              (step.get("foreach") or {}).get("items"), loop.get("until"), loop.get("output"), workflow.get("input"))
    return [value for value in values if isinstance(value, str)]


def _own_reads(step: dict[str, Any]) -> set[str] | None:
    """The step ids a step's own keys depend on or name (not its inner steps'); None when
    an expression reads `steps` other than by literal ids (it may read any of them)."""
    found: set[str] = set(step.get("depends_on") or [])
    code = step.get("code") if isinstance(step.get("code"), dict) else None
    if code is not None:  # what its source reads: `steps['id']` literals, else any step
        named = step_reads(code.get("source") or "")
        if named is None:
            return None
        found |= named
    sources = [s for text in _templates(step) for s in expressions.placeholders(text)] + _expressions(step)
    for source in sources:
        if expressions.LEGACY.match(source):
            found.update(expressions.step_refs(source))
            continue
        try:
            compiled = expressions.compile_expression(source)
        except expressions.ExpressionError:
            continue
        if compiled.all_steps:
            return None
        found.update(compiled.step_refs)
    return found


def reads(step: dict[str, Any]) -> set[str] | None:
    """The step ids a step (with everything inside it) depends on or names; None when
    one of them may read any step."""
    found: set[str] = set()
    for inner, _depth, _where in shape.walk([step]):
        own = _own_reads(inner)
        if own is None:
            return None
        found |= own
    return found


def run_again(steps: list[dict[str, Any]], from_step: str | None) -> set[str]:
    """`from_step` and every step downstream of it, at any level: a step whose own keys
    read one of them (directly or through others) with everything inside it (its items
    and iterations read what it maps or loops on), a container holding one, and every
    step of a loop's body holding one (a later iteration reads the earlier through
    `loop.previous`). These run again in every instance, whatever they read."""
    if from_step is None:
        return set()
    every = [step for step, _depth, _where in shape.walk(steps) if "id" in step]
    inside = {step["id"]: {s["id"] for s, _d, _w in shape.walk(shape.inner_steps(step)) if "id" in s}
              for step in every}
    loops = [step for step in every if shape.kind_of(step) == "loop"]
    again, changed = {from_step}, True
    while changed:
        changed = False
        for step in every:
            sid = step["id"]
            read = _own_reads(step)
            if read is None or read & again:
                found = {sid} | inside[sid]
            elif inside[sid] & again or any(sid in inside[loop["id"]] and inside[loop["id"]] & again
                                             for loop in loops):
                found = {sid}
            else:
                continue
            if not found <= again:
                again |= found
                changed = True
    return again


def _ordered(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One level's steps in an order where each comes after what it depends on."""
    done: set[str] = set()
    out: list[dict[str, Any]] = []
    left = list(steps)
    while left:
        ready = [s for s in left if set(s.get("depends_on") or []) <= done] or left[:1]
        for step in ready:
            out.append(step)
            done.add(step["id"])
            left.remove(step)
    return out


# -- keys -----------------------------------------------------------------------------------
AgentLookup = Callable[[Any], Awaitable[Any]]  # an AgentRef → its AgentConfig, or None


class ForkKeys:
    """The reuse key a call of the fork would have (engine/reuse.call_key), with the
    workers' and nodes' configurations as they are now."""

    def __init__(self, files: list[dict[str, Any]], agent: AgentLookup) -> None:
        self.files = files
        self.agent = agent
        self._defs: dict[str, StepDef | None] = {}

    def _definition(self, step: dict[str, Any]) -> StepDef | None:
        sid = step["id"]
        if sid not in self._defs:
            try:
                self._defs[sid] = step_defs([step])[0]
            except Exception:  # noqa: BLE001 - a step the engine could not read is never the same call
                self._defs[sid] = None
        return self._defs[sid]

    async def key(self, step: dict[str, Any], prompt: str) -> str | None:
        definition = self._definition(step)
        if definition is None or not keyed(definition):
            return None
        if definition.human:
            return call_key(definition, prompt, self.files, None)
        config = await self.agent(definition.agent)
        if config is None or not config.provider_kind or not config.model:
            return None
        return call_key(definition, prompt, self.files, agent_fingerprint(config))


class Planner:
    """Decides, level by level, which source instances a fork reuses."""

    def __init__(self, source: Source, *, forced: set[str], overrides: dict[str, Any],
                 keys: ForkKeys, sandbox: Any = None) -> None:
        self.source = source
        self.forced = forced  # step ids that run again in every instance (`run_again`)
        self.overrides = overrides  # top-level step id → the output the fork sets
        self.keys = keys
        self.sandbox = sandbox
        self.plan = Plan()

    async def run(self, steps: list[dict[str, Any]], new_input: Any) -> Plan:
        await self._level(steps, "", {"input": self.source.input, "steps": {}},
                          {"input": new_input, "steps": {}}, set())
        return self.plan

    def _record(self, path: str) -> Record | None:
        return self.source.records.get(path)

    def _succeeded(self, path: str) -> bool:
        record = self._record(path)
        return record is not None and record.status == SUCCEEDED

    async def _values(self, checks: list[tuple[str, str]], variables: dict[str, Any]) -> list[Any]:
        out: list[Any] = []
        scope = Scope(variables, self.sandbox)
        for kind, text in checks:
            try:
                out.append(await expressions.render(text, scope) if kind == "render"
                           else await scope.evaluate(text))
            except Exception:  # noqa: BLE001 - a failing expression fails its step: it runs again
                out.append(_DIFFERENT)
        return out

    async def _same(self, checks: list[tuple[str, str]], old: dict[str, Any], new: dict[str, Any]) -> bool:
        """Whether every expression gives the same value in the source and in the fork."""
        if not checks:
            return True
        before, after = await self._values(checks, old), await self._values(checks, new)
        return all(a is not _DIFFERENT and a == b for a, b in zip(before, after, strict=True))

    async def _level(self, steps: list[dict[str, Any]], prefix: str, old_vars: dict[str, Any],
                     new_vars: dict[str, Any], unknown: set[str]
                     ) -> tuple[bool, dict[str, Any], dict[str, Any]]:
        """Decide one level's steps under `prefix`; (all reused, source states, fork
        states) of the level's own steps."""
        old_states, new_states = dict(old_vars.get("steps") or {}), dict(new_vars.get("steps") or {})
        unknown = set(unknown)
        own_old: dict[str, Any] = {}
        own_new: dict[str, Any] = {}
        every = True
        for step in _ordered(steps):
            sid, path = step["id"], prefix + step["id"]
            record = self._record(path)
            before = {"output": record.output, "status": record.status} if record else None
            if before is not None:
                old_states[sid] = own_old[sid] = before
            if not prefix and sid in self.overrides:
                new_states[sid] = own_new[sid] = {"output": self.overrides[sid], "status": SUCCEEDED}
                continue
            old = {**old_vars, "steps": old_states}
            new = {**new_vars, "steps": new_states}
            if await self._step(step, path, old, new, unknown):
                new_states[sid] = own_new[sid] = before
            else:
                unknown.add(sid)
                every = False
        return every, own_old, own_new

    async def _step(self, step: dict[str, Any], path: str, old: dict[str, Any], new: dict[str, Any],
                    unknown: set[str]) -> bool:
        """Whether the instance at `path` is reused (its reused instances below noted)."""
        sid = step["id"]
        src = self.source.steps.get(sid)
        read = reads(step)
        if src is None or sid in self.forced or (unknown and (read is None or read & unknown)):
            return False
        if step.get("when") and not await self._same([("eval", step["when"])], old, new):
            return False
        same = own_keys(src) == own_keys(step)
        kind = shape.kind_of(step)
        if kind != shape.kind_of(src):  # a step that became a map, a loop or a call
            return False
        if kind == "step":
            ok = await self._call(step, src, path, old, new)
        elif kind == "foreach":  # items are decided even when the map's own keys changed
            ok = await self._foreach(step, src, path, old, new, unknown) and same and self._succeeded(path)
        else:  # iterations too, when the loop's own settings changed
            ok = await self._loop(step, path, old, new, unknown) and same and self._succeeded(path)
        if ok:
            self.plan.reused.append(path)
        return ok

    async def _call(self, step: dict[str, Any], src: dict[str, Any], path: str, old: dict[str, Any],
                    new: dict[str, Any]) -> bool:
        """Whether the call at `path` (a step, or an item of a one-call foreach) would be
        the source's call there: by reuse key when the source's has one, else by
        definition and everything it renders."""
        record = self._record(path)
        if record is None or record.status != SUCCEEDED:
            return False
        if record.key is not None:
            prompt = (await self._values([("render", step.get("prompt") or "")], new))[0]
            return prompt is not _DIFFERENT and await self.keys.key(step, prompt) == record.key
        if src != step:
            return False
        http = step.get("http") if isinstance(step.get("http"), dict) else None
        if http is not None:  # a secret's value is never read here: its name stands for it
            hidden = {"secrets": dict.fromkeys(secret_names(http), "")}
            old, new = {**old, **hidden}, {**new, **hidden}
        checks = [("render", text) for text in _templates(step)]
        if isinstance(step.get("workflow"), dict):
            checks.append(("eval", step["workflow"].get("input") or "null"))
        return await self._same(checks, old, new)

    async def _foreach(self, step: dict[str, Any], src: dict[str, Any], path: str, old: dict[str, Any],
                       new: dict[str, Any], unknown: set[str]) -> bool:
        """Notes the items reused; True when every item is and the list is the source's."""
        before = (await self._values([("eval", src["foreach"]["items"])], old))[0]
        after = (await self._values([("eval", step["foreach"]["items"])], new))[0]
        if not isinstance(before, list) or not isinstance(after, list):
            return False
        every = before == after
        inner = step.get("steps")
        for index, item in enumerate(after):
            if index >= len(before) or before[index] != item:
                every = False
                continue
            ipath = instances.item_path(path, index)
            item_old = {**old, "item": item, "index": index}
            item_new = {**new, "item": item, "index": index}
            if inner:
                ok, own_old, own_new = await self._level(inner, instances.inside(ipath), item_old, item_new, unknown)
                output = [("eval", step["output"])] if step.get("output") else []
                ok = ok and src.get("output") == step.get("output") and await self._same(
                    output, {**item_old, "steps": {**old["steps"], **own_old}},
                    {**item_new, "steps": {**new["steps"], **own_new}})
                ok = ok and self._succeeded(ipath)
            else:
                ok = await self._call(step, src, ipath, item_old, item_new)
            if ok:
                self.plan.reused.append(ipath)
            else:
                every = False
        return every

    async def _loop(self, step: dict[str, Any], path: str, old: dict[str, Any], new: dict[str, Any],
                    unknown: set[str]) -> bool:
        """Notes the iterations reused: iteration k when 1…k-1 were, the fork's loop goes
        on past k-1 and k's steps are reused. True when the fork's loop ends where the
        source's did, with the source's output."""
        spec = step["loop"]
        previous_old = previous_new = None
        iteration, own_new, last_new = 0, {}, new
        while iteration < int(spec["max_iterations"]):
            iteration += 1
            ipath = instances.iteration_path(path, iteration)
            if not self._succeeded(ipath):
                return False  # the source never finished this iteration: the loop runs on
            loop_old = {**old, "loop": {"iteration": iteration, "previous": previous_old}}
            loop_new = {**new, "loop": {"iteration": iteration, "previous": previous_new}}
            ok, own_old, own_new = await self._level(spec["steps"], instances.inside(ipath),
                                                     loop_old, loop_new, unknown)
            if not ok:
                return False
            self.plan.reused.append(ipath)
            last_new = {**loop_new, "steps": {**new["steps"], **own_new}}
            ended = (await self._values([("eval", spec["until"])], last_new))[0]
            if not isinstance(ended, bool):
                return False  # the engine fails the loop on it
            if ended:
                break
            previous_old, previous_new = own_old, own_new
        if self._succeeded(instances.iteration_path(path, iteration + 1)):
            return False  # the source's loop went on: the fork's ends elsewhere
        if spec.get("output"):
            output = (await self._values([("eval", spec["output"])], last_new))[0]
        else:
            output = (own_new.get(spec["steps"][-1]["id"]) or {}).get("output") if spec["steps"] else None
        record = self._record(path)
        return record is not None and output is not _DIFFERENT and output == record.output
