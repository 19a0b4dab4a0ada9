"""foreach and loop steps (SPEC §8): containers of instances, durable per instance.

A container runs instances below its own path — items `research[3]`, iterations
`improve#2` — through the scheduler's two entry points: `_run_call` (one agent or human
call at a path) and `_run_steps` (a small workflow under a path prefix). Each instance
is a stored row; one that a stored row says has succeeded is not run again, its output
is used (`live.finished`), so a resumed run goes on where the stopped one was.

A foreach runs at most `max_concurrency` items at once through that many worker tasks
(never a task per item), so a 1,000-item map holds only the items in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra.engine.instances import inside, item_path, iteration_path
from orchestra.engine.language.expressions import ExpressionError, Scope
from orchestra.engine.live import HandBack, LiveRun, StepFailure

DEFAULT_CONCURRENCY = 4


def _steps_view(variables: dict[str, Any], inner: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `steps` an expression inside an item or iteration sees: the container's, with
    the item's or iteration's own steps over them."""
    return {**(variables.get("steps") or {}), **inner}


def _last_output(steps: list[dict[str, Any]], inner: dict[str, dict[str, Any]]) -> Any:
    last = steps[-1]["id"] if steps else None
    return (inner.get(last) or {}).get("output")


class Containers:
    """Engine part: foreach and loop steps."""

    # -- foreach --------------------------------------------------------------------------
    async def _foreach_items(self, spec: dict[str, Any], variables: dict[str, Any]) -> list[Any]:
        """The list a foreach maps, or StepFailure saying why there is none to map."""
        try:
            items = await Scope(variables, self.sandbox).evaluate(spec["items"])
        except ExpressionError as exc:
            raise StepFailure(f"foreach items: {exc.message}") from None
        if not isinstance(items, list):
            kind = "null" if items is None else type(items).__name__
            raise StepFailure(f"foreach items (`{spec['items']}`) gave a {kind}, not a list.")
        limit = self.settings.foreach_max_items
        if len(items) > limit:
            raise StepFailure(
                f"foreach items (`{spec['items']}`) gave {len(items)} items; at most {limit} "
                "may be mapped (ORCHESTRA_FOREACH_MAX_ITEMS)."
            )
        return items

    async def _foreach(self, live: LiveRun, step: dict[str, Any], path: str,
                       variables: dict[str, Any]) -> Any:
        spec = step["foreach"]
        try:
            items = await self._foreach_items(spec, variables)
        except StepFailure as failure:  # it never started: its row and step_failed all the same
            self._instance_failed(live, step, path, failure.message)
            raise
        self._instance_started(live, step, path, {"items": len(items)})
        results: list[Any] = [None] * len(items)
        failed: list[int] = []
        continue_on_error = spec.get("on_error", "fail") == "continue"
        inner = step.get("steps")
        pending = iter(range(len(items)))

        async def one(index: int) -> None:
            ipath = item_path(path, index)
            if live.finished.succeeded(ipath):
                results[index] = live.finished.output(ipath)
                return
            scope_vars = {**variables, "item": items[index], "index": index}
            try:
                if inner:
                    results[index] = await self._workflow_instance(
                        live, step, ipath, inner, scope_vars, step.get("output"))
                else:
                    results[index] = await self._call(live, step, ipath, Scope(scope_vars, self.sandbox),
                                                        durable=True)
            except StepFailure as failure:
                if not continue_on_error:
                    raise StepFailure(f"item {ipath} failed: {failure.message}") from None
                failed.append(index)

        async def worker() -> None:
            for index in pending:  # one shared iterator: each index is taken once
                if self.stopping:
                    return
                await one(index)

        width = max(1, min(int(spec.get("max_concurrency") or DEFAULT_CONCURRENCY), len(items) or 1))
        workers = [asyncio.get_running_loop().create_task(worker()) for _ in range(width)]
        try:
            await _first_failure(workers)
        except StepFailure as failure:
            self._instance_failed(live, step, path, failure.message)
            raise
        if self.stopping and any(not live.finished.succeeded(item_path(path, i))
                                 for i in range(len(items)) if i not in failed):
            raise HandBack()  # items left for whoever claims the run next
        self._instance_succeeded(
            live, step, path, results,
            {"items": {"total": len(items), "succeeded": len(items) - len(failed),
                       "failed": len(failed)}},
        )
        return results

    # -- loop -----------------------------------------------------------------------------
    async def _loop(self, live: LiveRun, step: dict[str, Any], path: str,
                    variables: dict[str, Any]) -> Any:
        spec = step["loop"]
        inner_defs = spec["steps"]
        most = int(spec["max_iterations"])
        self._instance_started(live, step, path, {"max_iterations": most})
        previous: dict[str, Any] | None = None
        done = False
        iteration = 0
        inner: dict[str, dict[str, Any]] = {}
        scope = Scope(variables, self.sandbox)
        try:
            while iteration < most and not done:
                iteration += 1
                ipath = iteration_path(path, iteration)
                scope_vars = {**variables, "loop": {"iteration": iteration, "previous": previous}}
                if live.finished.succeeded(ipath):
                    inner = self._stored_steps(live, inner_defs, inside(ipath))
                else:
                    inner = await self._iteration(live, step, ipath, inner_defs, scope_vars)
                scope = Scope({**scope_vars, "steps": _steps_view(variables, inner)}, self.sandbox)
                try:
                    done = await scope.truth(spec["until"])
                except ExpressionError as exc:
                    raise StepFailure(f"loop until: {exc.message}") from None
                previous = inner
            if spec.get("output"):
                try:
                    output = await scope.evaluate(spec["output"])
                except ExpressionError as exc:
                    raise StepFailure(f"loop output: {exc.message}") from None
            else:
                output = _last_output(inner_defs, inner)
        except StepFailure as failure:
            self._instance_failed(live, step, path, failure.message)
            raise
        self._instance_succeeded(live, step, path, output,
                                 {"iterations": iteration, "exhausted": not done})
        return output

    async def _iteration(self, live: LiveRun, step: dict[str, Any], ipath: str,
                         inner_defs: list[dict[str, Any]], scope_vars: dict[str, Any]
                         ) -> dict[str, dict[str, Any]]:
        """One iteration's small workflow; its stored row says when it succeeded."""
        self._instance_started(live, step, ipath, {"iteration": scope_vars["loop"]["iteration"]})
        try:
            inner = await self._run_steps(live, inner_defs, inside(ipath), scope_vars)
        except StepFailure as failure:
            self._instance_failed(live, step, ipath, failure.message)
            raise
        await self._stored(live, self._instance_succeeded(live, step, ipath, _last_output(inner_defs, inner), {}))
        return inner

    async def _workflow_instance(self, live: LiveRun, step: dict[str, Any], ipath: str,
                                 inner_defs: list[dict[str, Any]], scope_vars: dict[str, Any],
                                 output_expr: str | None) -> Any:
        """One foreach item's small workflow, and its output (`output`, or the last
        inner step's)."""
        self._instance_started(live, step, ipath, {"index": scope_vars["index"]})
        try:
            inner = await self._run_steps(live, inner_defs, inside(ipath), scope_vars)
            if output_expr:
                try:
                    output = await Scope({**scope_vars, "steps": _steps_view(scope_vars, inner)},
                                         self.sandbox).evaluate(output_expr)
                except ExpressionError as exc:
                    raise StepFailure(f"foreach output: {exc.message}") from None
            else:
                output = _last_output(inner_defs, inner)
        except StepFailure as failure:
            self._instance_failed(live, step, ipath, failure.message)
            await self._stored(live)
            raise
        await self._stored(live, self._instance_succeeded(live, step, ipath, output, {}))
        return output

    def _stored_steps(self, live: LiveRun, inner_defs: list[dict[str, Any]], prefix: str
                      ) -> dict[str, dict[str, Any]]:
        """A finished iteration's `steps`, read back from its stored instances."""
        out: dict[str, dict[str, Any]] = {}
        for inner in inner_defs:
            record = live.finished.records.get(prefix + inner["id"])
            if record is not None:
                out[inner["id"]] = {"output": record.output, "status": record.status}
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
