"""DAG scheduling: a run's steps start as their dependencies succeed, independent ones
concurrently; each step's start, end and output are written through the run's writer.

Scheduling works level by level (SPEC §8): the template's steps are one level, the inner
steps of a foreach item (`research[3].…`) or of a loop iteration (`improve#2.…`) another,
each run by `_run_steps` under its path prefix. An instance whose stored row says it
succeeded is not run again (`live.finished`): what runs next is a function of the
template and the stored instances only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra.db.models import utcnow
from orchestra.engine.instances import kind_of
from orchestra.engine.language.expressions import ExpressionError, Scope, render
from orchestra.engine.live import HandBack, LiveRun, RunFailed, StepAt, StepFailure
from orchestra.engine.vocabulary import EventKind, StepStatus


def output_fields(value: Any) -> dict[str, Any]:
    """How an output is stored: text in `output`, any other JSON value in `output_value`."""
    if value is None or isinstance(value, str):
        return {"output": value, "output_value": None}
    return {"output": None, "output_value": value}


class Scheduler:
    """Engine part: which steps run next, and one step from start to output."""

    async def _schedule(self, live: LiveRun) -> dict[str, Any]:
        """The run's steps, to the end; {id: output} of the top-level steps."""
        states = await self._run_steps(live, live.steps, "", {"input": live.input})
        live.outputs = {sid: state["output"] for sid, state in states.items()}
        return live.outputs

    async def _run_steps(self, live: LiveRun, steps: list[dict[str, Any]], prefix: str,
                         variables: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Run one level's steps under `prefix`: start steps as their dependencies
        succeed; independent ones run concurrently. While the process stops, no step
        starts, and a run with nothing but questions in flight is handed back. Returns
        {id: {output, status}} of the level's steps."""
        states: dict[str, dict[str, Any]] = {}
        for step in steps:  # finished before (resume, take-over): used, never run again
            path = prefix + step["id"]
            if live.finished.succeeded(path):
                states[step["id"]] = {"output": live.finished.output(path), "status": StepStatus.SUCCEEDED}
        started: set[str] = set(states)
        tasks: dict[asyncio.Task, str] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                live.writes.check()  # a failed write (the run was deleted, …) ends the run
                if not self.stopping:
                    for step in steps:
                        sid = step["id"]
                        if sid in started or not all(d in states for d in step.get("depends_on", [])):
                            continue
                        started.add(sid)
                        scope_vars = {**variables, "steps": {**(variables.get("steps") or {}), **states}}
                        tasks[loop.create_task(self._instance(live, step, prefix + sid, scope_vars))] = sid
                if not tasks:
                    if self.stopping and len(states) < len(steps):
                        raise HandBack()
                    return states
                if self.stopping and all(prefix + sid in live.waiting for sid in tasks.values()):
                    raise HandBack()
                await self.log.release()
                wake = loop.create_future()
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
                        states[sid] = {"output": task.result(), "status": StepStatus.SUCCEEDED}
                    elif isinstance(error, StepFailure):
                        if prefix:  # inside an item or iteration: the container decides
                            raise StepFailure(f"step {prefix + sid} failed: {error.message}")
                        failure = failure or RunFailed(sid, f"Step '{sid}' failed: {error.message}")
                    else:
                        raise error
                if failure is not None:
                    raise failure
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _instance(self, live: LiveRun, step: dict[str, Any], path: str,
                        variables: dict[str, Any]) -> Any:
        """One step instance at `path`: a call, a foreach or a loop; its output."""
        kind = kind_of(step)
        if kind == "foreach":
            return await self._foreach(live, step, path, variables)
        if kind == "loop":
            return await self._loop(live, step, path, variables)
        return await self._run_call(live, step, path, variables)

    async def _run_call(self, live: LiveRun, step: dict[str, Any], path: str,
                        variables: dict[str, Any], *, durable: bool = False) -> Any:
        """One agent or human call at `path` (a top-level step, a foreach item, an inner
        step): its row, its events, its output. StepFailure when it fails. `durable`:
        return only once its end is stored (a foreach item: what a crash must not redo)."""
        trace_id, writes = live.trace_id, live.writes
        sid = StepAt(step["id"], path)
        try:
            prompt = render(step["prompt"], Scope(variables))
        except ExpressionError as exc:
            prompt, failure = None, StepFailure(exc.message)
        else:
            failure = None
        earlier = live.take_earlier(sid, prompt) if step["agent"].get("human") and prompt is not None else None
        if earlier is None:  # a human step re-waiting on its open question starts nothing
            writes.submit(self._put_instance, trace_id, path, step["id"],
                          status=StepStatus.RUNNING, started_at=utcnow())
            writes.submit(
                self.log.append, trace_id, EventKind.STEP_STARTED,
                {"path": path, "agent": step["agent"], "prompt": prompt}, step_id=sid,
            )
        pending_text = ""
        try:
            if failure is not None:
                raise failure
            if step["agent"].get("human"):
                output, usage = await self._ask(live, sid, prompt, earlier=earlier), None
            else:
                output, usage, pending_text = await self._agent_step(live, {**step, "id": sid}, prompt)
        except StepFailure as failure:
            writes.submit(self._set_step, trace_id, path, status=StepStatus.FAILED, error=failure.message,
                          finished_at=utcnow())
            writes.submit(
                self.log.append, trace_id, EventKind.STEP_FAILED,
                {"path": path, "error": failure.message}, step_id=sid,
            )
            live.finished.set(path, StepStatus.FAILED)
            if durable:
                await self._stored(live)
            raise
        writes.submit(
            self._set_step, trace_id, path, status=StepStatus.SUCCEEDED, usage=usage,
            finished_at=utcnow(), **output_fields(output),
        )
        last_tokens = [(EventKind.TOKEN, {"path": path, "text": pending_text}, sid)] if pending_text else []
        finished = (EventKind.STEP_FINISHED, {"path": path, "output": output, "usage": usage}, sid)
        stored = writes.submit(self.log.append_many, trace_id, last_tokens + [finished])
        live.finished.set(path, StepStatus.SUCCEEDED, output)
        if durable:
            await self._stored(live, stored)
        return output

    async def _stored(self, live: LiveRun, write: asyncio.Future | None = None) -> None:
        """Wait until `write` (else everything submitted so far) is stored; the writer's
        error, if a write failed, is raised (the run ends as for any failed write)."""
        if write is None:
            write = live.writes.submit(_nothing)
        await asyncio.shield(write)
        await self.log.release()

    # -- a container's own row and events -------------------------------------------------
    def _instance_started(self, live: LiveRun, step: dict[str, Any], path: str,
                          data: dict[str, Any]) -> None:
        writes = live.writes
        writes.submit(self._put_instance, live.trace_id, path, step["id"],
                      status=StepStatus.RUNNING, started_at=utcnow())
        writes.submit(self.log.append, live.trace_id, EventKind.STEP_STARTED,
                      {"path": path, **data}, step_id=step["id"])

    def _instance_succeeded(self, live: LiveRun, step: dict[str, Any], path: str, output: Any,
                            data: dict[str, Any]) -> asyncio.Future:
        """Store a container's (an item's, an iteration's) end; the future of its last write."""
        writes = live.writes
        writes.submit(self._set_step, live.trace_id, path, status=StepStatus.SUCCEEDED,
                      finished_at=utcnow(), **output_fields(output))
        live.finished.set(path, StepStatus.SUCCEEDED, output)
        return writes.submit(self.log.append, live.trace_id, EventKind.STEP_FINISHED,
                             {"path": path, "output": output, **data}, step_id=step["id"])

    def _instance_failed(self, live: LiveRun, step: dict[str, Any], path: str, message: str) -> None:
        writes = live.writes
        writes.submit(self._set_step, live.trace_id, path, status=StepStatus.FAILED, error=message,
                      finished_at=utcnow())
        writes.submit(self.log.append, live.trace_id, EventKind.STEP_FAILED,
                      {"path": path, "error": message}, step_id=step["id"])
        live.finished.set(path, StepStatus.FAILED)


async def _nothing() -> None:
    """A write that writes nothing: its future is done once every write before it is."""
