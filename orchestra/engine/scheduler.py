"""DAG scheduling with the workflow language's step policies (SPEC §4, §7), level by
level for loops and maps (SPEC §8).

A step is ready once its dependencies have *ended* (succeeded, skipped, or failed under
`on_error: continue`). Then skip propagation and `when` decide whether it runs
(`step_skipped {reason}` otherwise). A step that runs goes to the runner its kind names
in the dispatch table (`register`): `calls.Calls` for an agent or human call,
`containers.Containers` for a foreach or a loop. A failed step fails the run, or under
`on_error: continue` ends `failed` with a null output.

The template's steps are one level; the inner steps of a foreach item
(`research[3].…`) or of a loop iteration (`improve#2.…`) are another, run by
`run_steps` under that path prefix. An instance whose stored row says it ended is not
run again (`live.finished`): what runs next is a function of the template and the
stored instances only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from orchestra.engine.live import (
    HandBack,
    LimitReached,
    LiveRun,
    LiveRuns,
    RunFailed,
    StepFailure,
)
from orchestra.engine.model import At, StepDef, StepKind
from orchestra.engine.records import Records
from orchestra.engine.store import RunStore
from orchestra.language import policies
from orchestra.language.expressions import ExpressionError, Scope
from orchestra.language.sandbox import Sandbox
from orchestra.observability import runs as observe
from orchestra.vocabulary import StepStatus

#: Runs one step instance of a kind: (live, step, at, variables, scope) → its output;
#: StepFailure when it failed (its row and `step_failed` stored).
StepRunner = Callable[[LiveRun, StepDef, At, dict[str, Any], Scope], Awaitable[Any]]
States = dict[str, dict[str, Any]]


def ended(status: str, output: Any = None) -> dict[str, Any]:
    """A step's state as expressions see it in `steps`."""
    return {"output": output, "status": status}


class Scheduler:
    """Which steps run next, level by level; each step to the runner of its kind."""

    def __init__(self, *, store: RunStore, runs: LiveRuns, records: Records,
                 sandbox: Sandbox) -> None:
        self.store = store
        self.runs = runs
        self.records = records
        self.sandbox = sandbox
        self._kinds: dict[StepKind, StepRunner] = {}

    def register(self, kind: StepKind, runner: StepRunner) -> None:
        """The runner of a step kind (the engine registers each kind's part)."""
        self._kinds[kind] = runner

    async def schedule(self, live: LiveRun) -> States:
        """The run's steps, to the end. Returns every top-level step's state."""
        return await self.run_steps(live, live.steps, "", {"input": live.input}, live.states)

    def _stored_states(self, live: LiveRun, steps: tuple[StepDef, ...], prefix: str,
                       states: States) -> None:
        """Steps ended before (resume, take-over): used, never run again."""
        for step in steps:
            path = prefix + step.id
            status = live.finished.status(path)
            if step.id in states or status is None:
                continue
            if status == StepStatus.SUCCEEDED:
                states[step.id] = ended(status, live.finished.output(path))
            elif status == StepStatus.SKIPPED or (status == StepStatus.FAILED and step.continue_on_error):
                states[step.id] = ended(status)

    async def run_steps(self, live: LiveRun, steps: tuple[StepDef, ...], prefix: str,
                        variables: dict[str, Any], states: States | None = None) -> States:
        """Run one level's steps under `prefix`: start steps as their dependencies end;
        independent ones run concurrently. While the process stops, no step starts, and a
        run with nothing but questions in flight is handed back. Returns {id: {output,
        status}} of the level's steps. Inside a container (`prefix`), a failed step
        raises StepFailure naming its path, for the container to handle."""
        states = {} if states is None else states
        self._stored_states(live, steps, prefix, states)
        started: set[str] = set(states)
        tasks: dict[asyncio.Task, str] = {}
        try:
            while True:
                live.writes.check()  # a failed write (the run was deleted, …) ends the run
                if not self.runs.stopping:
                    await self._start_ready(live, steps, prefix, variables, states, started, tasks)
                if not tasks:
                    if self.runs.stopping and len(states) < len(steps):
                        raise HandBack()
                    return states
                if self.runs.stopping and all(prefix + sid in live.waiting for sid in tasks.values()):
                    raise HandBack()
                await self._wait(live, tasks, prefix, states)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait(self, live: LiveRun, tasks: dict[asyncio.Task, str], prefix: str,
                    states: States) -> None:
        """Until a step ends (or the run is poked); ended steps' states recorded."""
        await self.store.release()
        wake = asyncio.get_running_loop().create_future()
        live.wakes.add(wake)
        try:
            done, _ = await asyncio.wait([*tasks, wake], return_when=asyncio.FIRST_COMPLETED)
        finally:
            live.wakes.discard(wake)
        failure: RunFailed | None = None
        for task in done:
            if task is wake:
                continue
            sid = tasks.pop(task)
            error = task.exception()
            if error is None:
                states[sid] = task.result()
            elif isinstance(error, StepFailure):
                if prefix:  # inside an item or iteration: its container decides
                    raise StepFailure(f"step {prefix + sid} failed: {error.message}")
                failure = failure or RunFailed(sid, f"Step '{sid}' failed: {error.message}")
            elif isinstance(error, RunFailed) and prefix and not isinstance(error, LimitReached):
                raise StepFailure(f"step {prefix + sid} failed: {error.message}")
            else:
                raise error
        if failure is not None:
            raise failure

    async def _start_ready(self, live: LiveRun, steps: tuple[StepDef, ...], prefix: str,
                           variables: dict[str, Any], states: States, started: set[str],
                           tasks: dict[asyncio.Task, str]) -> None:
        """Start (or skip, or fail on a broken `when`) every step whose dependencies ended;
        a skip can make more steps ready, so look again until nothing changes."""
        loop = asyncio.get_running_loop()
        changed = True
        while changed:
            changed = False
            for step in steps:
                sid = step.id
                if sid in started or not all(d in states for d in step.depends_on):
                    continue
                started.add(sid)
                at = At(sid, prefix + sid)
                scope_vars = {**variables, "steps": {**(variables.get("steps") or {}), **states}}
                scope = Scope(scope_vars, self.sandbox)
                try:
                    decision = await policies.should_run(step.depends_on, step.when, states, scope)
                except ExpressionError as exc:  # a `when` that fails at run time fails its step
                    states[sid] = self._fail_without_running(live, step, at, exc.message)
                    changed = True
                    continue
                if not decision.run:
                    self.records.skipped(live, at, decision.reason or "when")
                    states[sid] = ended(StepStatus.SKIPPED)
                    changed = True
                    continue
                tasks[loop.create_task(observe.observed_step(
                    at.path, self._step(live, step, at, scope_vars, scope)))] = sid

    def _fail_without_running(self, live: LiveRun, step: StepDef, at: At,
                              message: str) -> dict[str, Any]:
        self.records.failed(live, at, message)
        if step.continue_on_error:
            return ended(StepStatus.FAILED)
        if at.path != step.id:
            raise StepFailure(message)
        raise RunFailed(step.id, f"Step '{step.id}' failed: {message}")

    async def _step(self, live: LiveRun, step: StepDef, at: At, variables: dict[str, Any],
                    scope: Scope) -> dict[str, Any]:
        """Run a step instance through its kind's runner; its ended state ({output,
        status}). A failure under `on_error: continue` ends it `failed`, null output."""
        try:
            return ended(StepStatus.SUCCEEDED, await self._kinds[step.kind](live, step, at, variables, scope))
        except StepFailure:
            if step.continue_on_error:
                return ended(StepStatus.FAILED)
            raise
