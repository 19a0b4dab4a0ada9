"""Which instances of a source run a fork reuses (SPEC §13), decided before it runs.

An instance is reused only when it succeeded in the source, its step's definition is the
same in the fork's steps, it is not `from_step` (nor inside it), and nothing it reads
differs: no step it depends on or names runs again, and every expression it reads
(`when`, the prompt, `foreach.items`, a loop's `until` and `output`) gives the same
value with the fork's input and outputs as it gave in the source (what a step reads is
rendered, not guessed). A step whose output is set by the fork's `outputs` is not run;
whatever reads it sees the new value. A foreach's items and a loop's iterations are
decided one by one by the same rule: item `i` is reused when the mapped list gives the
same value at `i` and the item's own steps are reused; iteration `k` when iterations
1…k-1 were all reused and its steps are reused. A container with everything under it
reused is reused itself; otherwise it runs again, and the engine skips the instances
already stored under it, so only what is not reused reaches a provider.

What a step reads of a step that runs again cannot be known before it runs, so such a
step runs again too: the plan is exact for `input`, overridden outputs and the fork's
version, and otherwise follows the dependency graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestra.engine import instances
from orchestra.engine.language import expressions
from orchestra.engine.language.expressions import Scope
from orchestra.services.template_diff import own_keys

SUCCEEDED = "succeeded"
_DIFFERENT = object()  # what an expression that fails gives: never equal to anything


@dataclass(frozen=True, slots=True)
class Source:
    """The source run as a fork reads it: its instances by path (status, output), its
    steps by id (inner ones included) and its input."""

    records: dict[str, tuple[str, Any]]
    steps: dict[str, dict[str, Any]]
    input: Any


@dataclass(slots=True)
class Plan:
    """Paths of the source instances the fork reuses, in the order they were decided."""

    reused: list[str] = field(default_factory=list)


def reads(step: dict[str, Any]) -> set[str] | None:
    """The step ids a step (with everything inside it) depends on or names; None when
    an expression reads `steps` other than by literal ids (it may read any of them)."""
    found: set[str] = set(step.get("depends_on") or [])
    sources: list[str] = []
    for inner, _depth, _where in instances.walk([step]):
        found.update(inner.get("depends_on") or [])
        sources += expressions.placeholders(inner.get("prompt") or "")
        for value in (inner.get("when"), inner.get("output") if inner.get("foreach") is not None else None,
                      (inner.get("foreach") or {}).get("items"),
                      *((inner.get("loop") or {}).get(k) for k in ("until", "output"))):
            if isinstance(value, str):
                sources.append(value)
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


class Planner:
    """Decides, level by level, which source instances a fork reuses."""

    def __init__(self, source: Source, *, forced: set[str], overrides: dict[str, Any],
                 sandbox: Any = None) -> None:
        self.source = source
        self.forced = forced  # step ids that run again in every instance (from_step)
        self.overrides = overrides  # top-level step id → the output the fork sets
        self.sandbox = sandbox
        self.plan = Plan()

    async def run(self, steps: list[dict[str, Any]], new_input: Any) -> Plan:
        await self._level(steps, "", {"input": self.source.input, "steps": {}},
                          {"input": new_input, "steps": {}}, set())
        return self.plan

    def _record(self, path: str) -> tuple[str, Any] | None:
        return self.source.records.get(path)

    def _succeeded(self, path: str) -> bool:
        record = self._record(path)
        return record is not None and record[0] == SUCCEEDED

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
            before = {"output": record[1], "status": record[0]} if record else None
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
        if (src is None or sid in self.forced or own_keys(src) != own_keys(step)
                or (unknown and (read is None or read & unknown))):
            return False
        when = [("eval", step["when"])] if step.get("when") else []
        kind = instances.kind_of(step)
        if kind == "step":
            ok = (src == step and self._succeeded(path)
                  and await self._same([*when, ("render", step.get("prompt") or "")], old, new))
        elif not await self._same(when, old, new):
            return False
        elif kind == "foreach":
            ok = await self._foreach(step, path, old, new, unknown) and self._succeeded(path)
        else:
            ok = await self._loop(step, path, old, new, unknown) and self._succeeded(path)
        if ok:
            self.plan.reused.append(path)
        return ok

    async def _foreach(self, step: dict[str, Any], path: str, old: dict[str, Any], new: dict[str, Any],
                       unknown: set[str]) -> bool:
        check = [("eval", step["foreach"]["items"])]
        before, after = (await self._values(check, old))[0], (await self._values(check, new))[0]
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
                ok = ok and await self._same(output, {**item_old, "steps": {**old["steps"], **own_old}},
                                             {**item_new, "steps": {**new["steps"], **own_new}})
            else:
                ok = await self._same([("render", step.get("prompt") or "")], item_old, item_new)
            if ok and self._succeeded(ipath):
                self.plan.reused.append(ipath)
            else:
                every = False
        return every

    async def _loop(self, step: dict[str, Any], path: str, old: dict[str, Any], new: dict[str, Any],
                    unknown: set[str]) -> bool:
        spec = step["loop"]
        previous_old = previous_new = None
        iteration = 0
        last_old, last_new = old, new
        while True:
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
            last_old = {**loop_old, "steps": {**old["steps"], **own_old}}
            last_new = {**loop_new, "steps": {**new["steps"], **own_new}}
            until = [("eval", spec["until"])]
            ended = (await self._values(until, last_old))[0]
            if not await self._same(until, last_old, last_new):
                return False  # the fork's loop ends elsewhere: what follows runs
            if ended is True or iteration >= int(spec["max_iterations"]):
                break
            previous_old, previous_new = own_old, own_new
        output = [("eval", spec["output"])] if spec.get("output") else []
        return await self._same(output, last_old, last_new)
