"""foreach and loop steps (SPEC §8): containers of instances, durable per instance.

A container runs instances below its own path — items `research[3]`, iterations
`improve#2` — through two entry points: `Calls.call` (one agent or human call at a path) and
`Scheduler.run_steps` (a small workflow under a path prefix). Each instance
is a stored row; one that a stored row says has succeeded is not run again, its output
is used (`live.finished`), so a resumed run goes on where the stopped one was.

A foreach runs at most `max_concurrency` items at once through that many worker tasks
(never a task per item), so a 1,000-item map holds only the items in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra.engine.calls import Calls
from orchestra.engine.instances import inside, item_label, item_path, iteration_path
from orchestra.engine.live import HandBack, LiveRun, LiveRuns, StepFailure
from orchestra.engine.model import At, ForeachDef, StepDef
from orchestra.engine.records import Records
from orchestra.engine.scheduler import Scheduler
from orchestra.language.expressions import ExpressionError, Scope
from orchestra.language.sandbox import Sandbox

DEFAULT_CONCURRENCY = 4


def _steps_view(variables: dict[str, Any], inner: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `steps` an expression inside an item or iteration sees: the container's, with
    the item's or iteration's own steps over them."""
    return {**(variables.get("steps") or {}), **inner}


def _last_output(steps: tuple[StepDef, ...], inner: dict[str, dict[str, Any]]) -> Any:
    last = steps[-1].id if steps else None
    return (inner.get(last) or {}).get("output")


class Containers:
    """foreach and loop steps: their instances, through the scheduler and the calls."""

    def __init__(self, *, runs: LiveRuns, records: Records, scheduler: Scheduler, calls: Calls,
                 sandbox: Sandbox, foreach_max_items: int) -> None:
        self.runs = runs
        self.records = records
        self.scheduler = scheduler
        self.calls = calls
        self.sandbox = sandbox
        self.foreach_max_items = foreach_max_items

    # -- foreach --------------------------------------------------------------------------
    async def _foreach_items(self, spec: ForeachDef, variables: dict[str, Any]) -> list[Any]:
        """The list a foreach maps, or StepFailure saying why there is none to map."""
        try:
            items = await Scope(variables, self.sandbox).evaluate(spec.items)
        except ExpressionError as exc:
            raise StepFailure(f"foreach items: {exc.message}") from None
        if not isinstance(items, list):
            kind = "null" if items is None else type(items).__name__
            raise StepFailure(f"foreach items (`{spec.items}`) gave a {kind}, not a list.")
        limit = self.foreach_max_items
        if len(items) > limit:
            raise StepFailure(
                f"foreach items (`{spec.items}`) gave {len(items)} items; at most {limit} "
                "may be mapped (ORCHESTRA_FOREACH_MAX_ITEMS)."
            )
        return items

    async def foreach(self, live: LiveRun, step: StepDef, at: At, variables: dict[str, Any],
                      scope: Scope) -> Any:
        """The scheduler's entry for a foreach (StepKind.FOREACH): its items' results."""
        spec = step.foreach
        try:
            items = await self._foreach_items(spec, variables)
        except StepFailure as failure:  # it never started: its row and step_failed all the same
            self.records.failed(live, at, failure.message)
            raise
        self.records.started(live, at, {"items": len(items)})
        results: list[Any] = [None] * len(items)
        failed: list[int] = []
        pending = iter(range(len(items)))

        async def one(index: int) -> None:
            item = At(step.id, item_path(at.path, index))
            if live.finished.succeeded(item.path):
                results[index] = live.finished.output(item.path)
                return
            scope_vars = {**variables, "item": items[index], "index": index}
            live.item_labels[item.path] = item_label(items[index])
            try:
                if step.steps:
                    results[index] = await self._workflow_instance(live, step, item, scope_vars)
                else:
                    results[index] = await self.calls.call(live, step, item, Scope(scope_vars, self.sandbox),
                                                           durable=True)
            except StepFailure as failure:
                if not spec.continue_on_error:
                    raise StepFailure(f"item {item.path} failed: {failure.message}") from None
                failed.append(index)

        async def worker() -> None:
            for index in pending:  # one shared iterator: each index is taken once
                if self.runs.stopping:
                    return
                await one(index)

        width = max(1, min(spec.max_concurrency or DEFAULT_CONCURRENCY, len(items) or 1))
        workers = [asyncio.get_running_loop().create_task(worker()) for _ in range(width)]
        try:
            await _first_failure(workers)
        except StepFailure as failure:
            self.records.failed(live, at, failure.message)
            raise
        if self.runs.stopping and any(not live.finished.succeeded(item_path(at.path, i))
                                      for i in range(len(items)) if i not in failed):
            raise HandBack()  # items left for whoever claims the run next
        self.records.succeeded(
            live, at, results,
            {"items": {"total": len(items), "succeeded": len(items) - len(failed),
                       "failed": len(failed)}},
        )
        return results

    # -- loop -----------------------------------------------------------------------------
    async def loop(self, live: LiveRun, step: StepDef, at: At, variables: dict[str, Any],
                   scope: Scope) -> Any:
        """The scheduler's entry for a loop (StepKind.LOOP): its output."""
        spec = step.loop
        inner_defs = spec.steps
        most = spec.max_iterations
        self.records.started(live, at, {"max_iterations": most})
        previous: dict[str, Any] | None = None
        done = False
        iteration = 0
        inner: dict[str, dict[str, Any]] = {}
        try:
            while iteration < most and not done:
                iteration += 1
                ipath = At(step.id, iteration_path(at.path, iteration))
                scope_vars = {**variables, "loop": {"iteration": iteration, "previous": previous}}
                if live.finished.succeeded(ipath.path):
                    inner = self._stored_steps(live, inner_defs, inside(ipath.path))
                else:
                    inner = await self._iteration(live, ipath, inner_defs, scope_vars)
                scope = Scope({**scope_vars, "steps": _steps_view(variables, inner)}, self.sandbox)
                try:
                    done = await scope.truth(spec.until)
                except ExpressionError as exc:
                    raise StepFailure(f"loop until: {exc.message}") from None
                previous = inner
            if spec.output:
                try:
                    output = await scope.evaluate(spec.output)
                except ExpressionError as exc:
                    raise StepFailure(f"loop output: {exc.message}") from None
            else:
                output = _last_output(inner_defs, inner)
        except StepFailure as failure:
            self.records.failed(live, at, failure.message)
            raise
        self.records.succeeded(live, at, output, {"iterations": iteration, "exhausted": not done})
        return output

    async def _iteration(self, live: LiveRun, ipath: At, inner_defs: tuple[StepDef, ...],
                         scope_vars: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """One iteration's small workflow; its stored row says when it succeeded."""
        self.records.started(live, ipath, {"iteration": scope_vars["loop"]["iteration"]})
        try:
            inner = await self.scheduler.run_steps(live, inner_defs, inside(ipath.path), scope_vars)
        except StepFailure as failure:
            self.records.failed(live, ipath, failure.message)
            raise
        await self.records.stored(live, self.records.succeeded(
            live, ipath, _last_output(inner_defs, inner), {}))
        return inner

    async def _workflow_instance(self, live: LiveRun, step: StepDef, item: At,
                                 scope_vars: dict[str, Any]) -> Any:
        """One foreach item's small workflow, and its output (`output`, or the last
        inner step's)."""
        label = live.item_labels.get(item.path)
        self.records.started(live, item, {"index": scope_vars["index"], **({"item": label} if label else {})})
        try:
            inner = await self.scheduler.run_steps(live, step.steps, inside(item.path), scope_vars)
            if step.output:
                try:
                    output = await Scope({**scope_vars, "steps": _steps_view(scope_vars, inner)},
                                         self.sandbox).evaluate(step.output)
                except ExpressionError as exc:
                    raise StepFailure(f"foreach output: {exc.message}") from None
            else:
                output = _last_output(step.steps, inner)
        except StepFailure as failure:
            self.records.failed(live, item, failure.message)
            await self.records.stored(live)
            raise
        await self.records.stored(live, self.records.succeeded(live, item, output, {}))
        return output

    @staticmethod
    def _stored_steps(live: LiveRun, inner_defs: tuple[StepDef, ...], prefix: str
                      ) -> dict[str, dict[str, Any]]:
        """A finished iteration's `steps`, read back from its stored instances."""
        out: dict[str, dict[str, Any]] = {}
        for inner in inner_defs:
            record = live.finished.records.get(prefix + inner.id)
            if record is not None:
                out[inner.id] = {"output": record.output, "status": record.status}
        return out


async def _first_failure(tasks: list[asyncio.Task]) -> None:
    """Wait for every task; on the first exception cancel the others and raise it."""
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
