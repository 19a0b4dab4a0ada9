"""DAG scheduling with the workflow language's step policies (SPEC §4, §7), level by
level for loops and maps (SPEC §8).

A step is ready once its dependencies have *ended* (succeeded, skipped, or failed under
`on_error: continue`). Then skip propagation and `when` decide whether it runs
(`step_skipped {reason}` otherwise); a running step has attempts (`retry`: doubling
backoff with jitter, `step_retrying` between them), each bounded by `timeout_seconds`
and counted against `limits.max_steps`. A failed step fails the run, or under
`on_error: continue` ends `failed` with a null output. Each step's start, end and output
are written through the run's writer; its events carry `attempt` from the second on.

The template's steps are one level; the inner steps of a foreach item
(`research[3].…`) or of a loop iteration (`improve#2.…`) are another, run by
`_run_steps` under that path prefix (`containers.py`). An instance whose stored row
says it ended is not run again (`live.finished`): what runs next is a function of the
template and the stored instances only.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from orchestra.db.models import utcnow
from orchestra.engine.instances import kind_of
from orchestra.engine.language import policies
from orchestra.engine.language.expressions import ExpressionError, Scope
from orchestra.engine.live import HandBack, LimitReached, LiveRun, RunFailed, StepAt, StepFailure
from orchestra.engine.questions import Question
from orchestra.engine.sizes import check_output, render_bounded
from orchestra.engine.vocabulary import EventKind, StepStatus
from orchestra.observability import runs as observe


def _ended(status: str, output: Any = None) -> dict[str, Any]:
    return {"output": output, "status": status}


def output_fields(value: Any, structured: bool = False) -> dict[str, Any]:
    """How an output is stored: text in `output`, a JSON value in `output_value`."""
    if not structured and (value is None or isinstance(value, str)):
        return {"output": value, "output_value": None}
    return {"output": None, "output_value": value}


class Scheduler:
    """Engine part: which steps run next, and one step from start to output."""

    async def _schedule(self, live: LiveRun) -> dict[str, dict[str, Any]]:
        """The run's steps, to the end. Returns every top-level step's state."""
        return await self._run_steps(live, live.steps, "", {"input": live.input}, live.states)

    async def _run_steps(self, live: LiveRun, steps: list[dict[str, Any]], prefix: str,
                         variables: dict[str, Any],
                         states: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        """Run one level's steps under `prefix`: start steps as their dependencies end;
        independent ones run concurrently. While the process stops, no step starts, and a
        run with nothing but questions in flight is handed back. Returns {id: {output,
        status}} of the level's steps. Inside a container (`prefix`), a failed step
        raises StepFailure naming its path, for the container to handle."""
        states = {} if states is None else states
        for step in steps:  # ended before (resume, take-over): used, never run again
            sid, path = step["id"], prefix + step["id"]
            status = live.finished.status(path)
            if sid in states or status is None:
                continue
            if status == StepStatus.SUCCEEDED:
                states[sid] = _ended(status, live.finished.output(path))
            elif status == StepStatus.SKIPPED or (status == StepStatus.FAILED and step.get("on_error") == "continue"):
                states[sid] = _ended(status)
        started: set[str] = set(states)
        tasks: dict[asyncio.Task, str] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                live.writes.check()  # a failed write (the run was deleted, …) ends the run
                if not self.stopping:
                    await self._start_ready(live, steps, prefix, variables, states, started, tasks)
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
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _start_ready(self, live: LiveRun, steps: list[dict[str, Any]], prefix: str,
                     variables: dict[str, Any], states: dict[str, dict[str, Any]],
                     started: set[str], tasks: dict[asyncio.Task, str]) -> None:
        """Start (or skip, or fail on a broken `when`) every step whose dependencies ended;
        a skip can make more steps ready, so look again until nothing changes."""
        loop = asyncio.get_running_loop()
        changed = True
        while changed:
            changed = False
            for step in steps:
                sid = step["id"]
                if sid in started or not all(d in states for d in step.get("depends_on", [])):
                    continue
                started.add(sid)
                path = prefix + sid
                scope_vars = {**variables, "steps": {**(variables.get("steps") or {}), **states}}
                scope = Scope(scope_vars, self.sandbox)
                try:
                    decision = await policies.decide(step, states, scope)
                except ExpressionError as exc:  # a `when` that fails at run time fails its step
                    states[sid] = self._fail_without_running(live, step, path, exc.message)
                    changed = True
                    continue
                if not decision.run:
                    self._skip(live, step, path, decision.reason or "when")
                    states[sid] = _ended(StepStatus.SKIPPED)
                    changed = True
                    continue
                tasks[loop.create_task(observe.observed_step(
                    path, self._step(live, step, path, scope_vars, scope)))] = sid

    def _skip(self, live: LiveRun, step: dict[str, Any], path: str, reason: str) -> None:
        now = utcnow()
        live.writes.submit(self._put_instance, live.trace_id, path, step["id"], status=StepStatus.SKIPPED,
                           started_at=now, finished_at=now)
        live.writes.submit(self.log.append, live.trace_id, EventKind.STEP_SKIPPED,
                           {"reason": reason}, step_id=StepAt(step["id"], path))
        live.finished.set(path, StepStatus.SKIPPED)

    def _fail_without_running(self, live: LiveRun, step: dict[str, Any], path: str,
                              message: str) -> dict[str, Any]:
        sid = StepAt(step["id"], path)
        live.writes.submit(self._put_instance, live.trace_id, path, step["id"], status=StepStatus.FAILED,
                           error=message, finished_at=utcnow())
        live.writes.submit(self.log.append, live.trace_id, EventKind.STEP_FAILED,
                           {"error": message}, step_id=sid)
        live.finished.set(path, StepStatus.FAILED)
        if step.get("on_error") == "continue":
            return _ended(StepStatus.FAILED)
        if path != step["id"]:
            raise StepFailure(message)
        raise RunFailed(step["id"], f"Step '{step['id']}' failed: {message}")

    def _count_execution(self, live: LiveRun, sid: str) -> None:
        """limits.max_steps: the execution past the limit never starts; the run fails."""
        limit = (live.spec.get("limits") or {}).get("max_steps")
        if limit is not None and live.executions >= limit:
            raise LimitReached(sid, f"The run reached its limit of {limit} step executions "
                                    "(limits.max_steps).")
        live.executions += 1

    async def _step(self, live: LiveRun, step: dict[str, Any], path: str,
                    variables: dict[str, Any], scope: Scope) -> dict[str, Any]:
        """Run a step instance (a call, a foreach or a loop); its ended state ({output,
        status}). A failure under `on_error: continue` ends it `failed`, null output."""
        try:
            kind = kind_of(step)
            if kind == "foreach":
                return _ended(StepStatus.SUCCEEDED, await self._foreach(live, step, path, variables))
            if kind == "loop":
                return _ended(StepStatus.SUCCEEDED, await self._loop(live, step, path, variables))
            return _ended(StepStatus.SUCCEEDED, await self._call(live, step, path, scope))
        except StepFailure:
            if step.get("on_error") == "continue":
                return _ended(StepStatus.FAILED)
            raise

    async def _call(self, live: LiveRun, step: dict[str, Any], path: str, scope: Scope, *,
                    durable: bool = False) -> Any:
        """An agent or human call's attempts at `path`; its output, or StepFailure once
        the last attempt failed (its row and `step_failed` stored). `durable`: return only
        once its end is stored (a foreach item: what a crash must not redo)."""
        trace_id, writes = live.trace_id, live.writes
        sid = StepAt(step["id"], path)
        retry = step.get("retry") or {}
        max_attempts = int(retry.get("max_attempts", 1))
        attempt = live.step_attempts.get(path, 1)
        while True:
            live.step_attempts[path] = attempt
            try:
                self._count_execution(live, sid)
                output, usage, pending_text = await self._attempt(live, {**step, "id": sid}, scope, attempt)
                break
            except StepFailure as failure:
                if attempt < max_attempts:
                    delay = policies.retry_delay(float(retry.get("backoff_seconds", 0)), attempt)
                    writes.submit(self.log.append, trace_id, EventKind.STEP_RETRYING, {
                        "attempt": attempt, "error": failure.message, "delay_seconds": delay,
                    }, step_id=sid)
                    await self.log.release()
                    if delay:
                        await asyncio.sleep(delay)
                    attempt += 1
                    continue
                stored = self._instance_failed(live, step, path, failure.message)
                if durable:
                    await self._stored(live, stored)
                raise
        structured = "output_schema" in step
        last_tokens = [(EventKind.TOKEN, live.tagged(sid, {"text": pending_text}), sid)] if pending_text else []
        spend = self._spend_fields(live, path)
        finished = (EventKind.STEP_FINISHED, live.tagged(sid, {
            "output": output, "usage": usage, **({"cost_usd": spend["cost_usd"]} if spend else {})}), sid)
        stored = writes.submit_many(self._store_instances, (
            path, None, {"status": StepStatus.SUCCEEDED, "usage": usage, "finished_at": utcnow(),
                         **spend, **output_fields(output, structured)},
            last_tokens + [finished]), trace_id)
        live.finished.set(path, StepStatus.SUCCEEDED, output)
        if durable:
            await self._stored(live, stored)
        return output

    async def _attempt(self, live: LiveRun, step: dict[str, Any], scope: Scope,
                       attempt: int) -> tuple[Any, dict[str, int] | None, str]:
        """One attempt: (output, usage, last token text). StepFailure when it fails,
        `timed out after N s` past timeout_seconds (a human step's default, if it has
        one, is then its output). `step["id"]` is a StepAt: it carries the path."""
        trace_id, sid, writes = live.trace_id, step["id"], live.writes
        try:
            prompt = await render_bounded(step["prompt"], scope, limit=self.settings.prompt_max_bytes,
                                          where=sid.path)  # checked before any event carries it
        except ExpressionError as exc:
            raise StepFailure(exc.message) from None
        human = bool(step["agent"].get("human"))
        earlier = live.take_earlier(sid, prompt) if human else None
        if earlier is None:  # a human step re-waiting on its open question starts nothing
            values: dict[str, Any] = {"status": StepStatus.RUNNING, "attempt": attempt}
            if attempt == 1:
                values["started_at"] = utcnow()
            # A prompt is stored once: a human step's question is in its `reply_requested`.
            started = {"agent": step["agent"]} | ({} if human else {"prompt": prompt})
            writes.submit_many(self._store_instances, (sid.path, str(sid), values, [
                (EventKind.STEP_STARTED, live.tagged(sid, started), sid)]), trace_id)
        timeout = step.get("timeout_seconds")
        try:
            async with asyncio.timeout(remaining(timeout, earlier)):
                if human:
                    return await self._ask(live, sid, prompt, earlier=earlier,
                                           schema=step.get("output_schema")), None, ""
                return await self._agent_step(live, step, prompt)
        except TimeoutError:
            if human and "default" in step:
                await self._time_out_question(live, sid, step["default"])
                return step["default"], None, ""
            raise StepFailure(f"timed out after {timeout} s") from None

    async def _store_instances(self, changes: list[tuple], trace_id: str) -> None:
        """Instances' row changes (a row created when a step id is given, else updated)
        and their events, in order, in one transaction: one store round for a step's
        start or end, or for all the starts and ends that queued up together."""

        async def store() -> list:
            events = []
            for path, step_id, values, step_events in changes:
                if step_id is None:
                    await self._set_step(trace_id, path, **values)
                else:
                    await self._put_instance(trace_id, path, step_id, **values)
                events += step_events
            await self._store_spend(trace_id)  # settled calls' costs ride along
            return await self.log.insert(trace_id, events)

        await self._store_with_events(trace_id, store)

    async def _stored(self, live: LiveRun, write: asyncio.Future | None = None) -> None:
        """Wait until `write` (else everything submitted so far) is stored; a failed write
        raises its error (the run ends as for any failed write)."""
        if write is None:
            write = live.writes.submit(_nothing)
        await asyncio.shield(write)
        await self.log.release()

    # -- a container's own row and events (containers.py) --------------------------------
    def _instance_started(self, live: LiveRun, step: dict[str, Any], path: str,
                          data: dict[str, Any]) -> None:
        live.writes.submit_many(self._store_instances, (
            path, step["id"], {"status": StepStatus.RUNNING, "started_at": utcnow()},
            [(EventKind.STEP_STARTED, data, StepAt(step["id"], path))]), live.trace_id)

    def _instance_succeeded(self, live: LiveRun, step: dict[str, Any], path: str, output: Any,
                            data: dict[str, Any]) -> asyncio.Future:
        """Store a container's (an item's, an iteration's) end; the future of its last write.
        An output past the step output bound fails the instance instead (StepFailure)."""
        try:
            check_output(output, limit=self.settings.step_output_max_bytes, of=f"step '{path}'")
        except StepFailure as failure:
            self._instance_failed(live, step, path, failure.message)
            raise
        live.finished.set(path, StepStatus.SUCCEEDED, output)
        return live.writes.submit_many(self._store_instances, (
            path, None, {"status": StepStatus.SUCCEEDED, "finished_at": utcnow(), **output_fields(output)},
            [(EventKind.STEP_FINISHED, {"output": output, **data}, StepAt(step["id"], path))]), live.trace_id)

    def _instance_failed(self, live: LiveRun, step: dict[str, Any], path: str,
                         message: str) -> asyncio.Future:
        """Store an instance's failure and its `step_failed` (an upsert: an item that failed
        before it started, at its prompt, has no row yet); the future of that write."""
        sid = StepAt(step["id"], path)
        live.finished.set(path, StepStatus.FAILED)
        return live.writes.submit_many(self._store_instances, (
            path, str(sid), {"status": StepStatus.FAILED, "error": message, "finished_at": utcnow(),
                             **self._spend_fields(live, path)},
            [(EventKind.STEP_FAILED, live.tagged(sid, {"error": message}), sid)]), live.trace_id)


def remaining(timeout: float | None, earlier: Question | None) -> float | None:
    """What is left of a step's `timeout_seconds`: a question asked before a take-over or
    a restart has been waiting since it was asked (its stored time), not since now."""
    if timeout is None or earlier is None or earlier.asked_at is None:
        return timeout
    return max(0.0, timeout - (time.time() - earlier.asked_at))


async def _nothing() -> None:
    """A write that writes nothing: its future is done once every write before it is."""
