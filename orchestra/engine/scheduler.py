"""DAG scheduling with the workflow language's step policies (SPEC §4, §7).

A step is ready once its dependencies have *ended* (succeeded, skipped, or failed under
`on_error: continue`). Then skip propagation and `when` decide whether it runs
(`step_skipped {reason}` otherwise); a running step has attempts (`retry`: doubling
backoff with jitter, `step_retrying` between them), each bounded by `timeout_seconds`
and counted against `limits.max_steps`. A failed step fails the run, or under
`on_error: continue` ends `failed` with a null output. Each step's start, end and output
are written through the run's writer; its events carry `attempt` from the second on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra.db.models import utcnow
from orchestra.engine.language import policies
from orchestra.engine.language.expressions import ExpressionError, Scope
from orchestra.engine.live import HandBack, LimitReached, LiveRun, RunFailed, StepFailure
from orchestra.engine.prompts import render_prompt
from orchestra.engine.vocabulary import EventKind, StepStatus


def _ended(status: str, output: Any = None) -> dict[str, Any]:
    return {"output": output, "status": status}


class Scheduler:
    """Engine part: which steps run next, and one step from start to output."""

    async def _schedule(self, live: LiveRun) -> dict[str, dict[str, Any]]:
        """Start steps as their dependencies end; independent ones run concurrently.
        While the process stops, no step starts, and a run with nothing but questions in
        flight is handed back. Returns every step's state."""
        states = live.states
        started: set[str] = set(states)
        tasks: dict[asyncio.Task, str] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                live.writes.check()  # a failed write (the run was deleted, …) ends the run
                if not self.stopping:
                    self._start_ready(live, started, tasks)
                if not tasks:
                    if self.stopping and len(states) < len(live.steps):
                        raise HandBack()
                    return states
                if self.stopping and all(sid in live.waiting for sid in tasks.values()):
                    raise HandBack()
                await self.log.release()
                live.wake = loop.create_future()
                done, _ = await asyncio.wait([*tasks, live.wake], return_when=asyncio.FIRST_COMPLETED)
                failure: RunFailed | None = None
                for task in done:
                    if task is live.wake:
                        continue
                    sid = tasks.pop(task)
                    error = task.exception()
                    if error is None:
                        states[sid] = task.result()
                    elif isinstance(error, StepFailure):
                        failure = failure or RunFailed(sid, f"Step '{sid}' failed: {error.message}")
                    else:
                        raise error
                if failure is not None:
                    raise failure
        finally:
            live.wake = None
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    def _start_ready(self, live: LiveRun, started: set[str], tasks: dict[asyncio.Task, str]) -> None:
        """Start (or skip, or fail on a broken `when`) every step whose dependencies ended;
        a skip can make more steps ready, so look again until nothing changes."""
        states, loop = live.states, asyncio.get_running_loop()
        changed = True
        while changed:
            changed = False
            for step in live.steps:
                sid = step["id"]
                if sid in started or not all(d in states for d in step.get("depends_on", [])):
                    continue
                started.add(sid)
                scope = policies.step_scope(live.input, states)
                try:
                    decision = policies.decide(step, states, scope)
                except ExpressionError as exc:  # a `when` that fails at run time fails its step
                    states[sid] = self._fail_without_running(live, step, exc.message)
                    changed = True
                    continue
                if not decision.run:
                    self._skip(live, sid, decision.reason or "when")
                    states[sid] = _ended(StepStatus.SKIPPED)
                    changed = True
                    continue
                tasks[loop.create_task(self._step(live, step, scope))] = sid

    def _skip(self, live: LiveRun, sid: str, reason: str) -> None:
        now = utcnow()
        live.writes.submit(self._set_step, live.trace_id, sid, status=StepStatus.SKIPPED,
                           started_at=now, finished_at=now)
        live.writes.submit(self.log.append, live.trace_id, EventKind.STEP_SKIPPED,
                           {"reason": reason}, step_id=sid)

    def _fail_without_running(self, live: LiveRun, step: dict[str, Any], message: str) -> dict[str, Any]:
        sid = step["id"]
        live.writes.submit(self._set_step, live.trace_id, sid, status=StepStatus.FAILED,
                           error=message, finished_at=utcnow())
        live.writes.submit(self.log.append, live.trace_id, EventKind.STEP_FAILED,
                           {"error": message}, step_id=sid)
        if step.get("on_error") == "continue":
            return _ended(StepStatus.FAILED)
        raise RunFailed(sid, f"Step '{sid}' failed: {message}")

    def _count_execution(self, live: LiveRun, sid: str) -> None:
        """limits.max_steps: the execution past the limit never starts; the run fails."""
        limit = (live.spec.get("limits") or {}).get("max_steps")
        if limit is not None and live.executions >= limit:
            raise LimitReached(sid, f"The run reached its limit of {limit} step executions "
                                    "(limits.max_steps).")
        live.executions += 1

    async def _step(self, live: LiveRun, step: dict[str, Any], scope: Scope) -> dict[str, Any]:
        """Run a step's attempts; its ended state ({output, status})."""
        trace_id, sid, writes = live.trace_id, step["id"], live.writes
        retry = step.get("retry") or {}
        max_attempts = int(retry.get("max_attempts", 1))
        attempt = live.step_attempts.get(sid, 1)
        while True:
            live.step_attempts[sid] = attempt
            try:
                self._count_execution(live, sid)
                output, usage, pending_text = await self._attempt(live, step, scope, attempt)
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
                writes.submit(self._set_step, trace_id, sid, status=StepStatus.FAILED,
                              error=failure.message, finished_at=utcnow())
                writes.submit(self.log.append, trace_id, EventKind.STEP_FAILED,
                              live.tagged(sid, {"error": failure.message}), step_id=sid)
                if step.get("on_error") == "continue":
                    return _ended(StepStatus.FAILED)
                raise
        structured = "output_schema" in step
        writes.submit(
            self._set_step, trace_id, sid, status=StepStatus.SUCCEEDED,
            output=None if structured else output, output_value=output if structured else None,
            usage=usage, finished_at=utcnow(),
        )
        last_tokens = [(EventKind.TOKEN, live.tagged(sid, {"text": pending_text}), sid)] if pending_text else []
        finished = (EventKind.STEP_FINISHED, live.tagged(sid, {"output": output, "usage": usage}), sid)
        writes.submit(self.log.append_many, trace_id, last_tokens + [finished])
        return _ended(StepStatus.SUCCEEDED, output)

    async def _attempt(self, live: LiveRun, step: dict[str, Any], scope: Scope,
                       attempt: int) -> tuple[Any, dict[str, int] | None, str]:
        """One attempt: (output, usage, last token text). StepFailure when it fails,
        `timed out after N s` past timeout_seconds (a human step's default, if it has
        one, is then its output)."""
        trace_id, sid, writes = live.trace_id, step["id"], live.writes
        try:
            prompt = render_prompt(step["prompt"], input=live.input, scope=scope)
        except ExpressionError as exc:
            raise StepFailure(exc.message) from None
        human = bool(step["agent"].get("human"))
        earlier = live.take_earlier(sid, prompt) if human else None
        if earlier is None:  # a human step re-waiting on its open question starts nothing
            values: dict[str, Any] = {"status": StepStatus.RUNNING, "attempt": attempt}
            if attempt == 1:
                values["started_at"] = utcnow()
            writes.submit(self._set_step, trace_id, sid, **values)
            writes.submit(
                self.log.append, trace_id, EventKind.STEP_STARTED,
                live.tagged(sid, {"agent": step["agent"], "prompt": prompt}), step_id=sid,
            )
        timeout = step.get("timeout_seconds")
        try:
            async with asyncio.timeout(timeout):
                if human:
                    return await self._ask(live, sid, prompt, earlier=earlier,
                                           schema=step.get("output_schema")), None, ""
                return await self._agent_step(live, step, prompt)
        except TimeoutError:
            if human and "default" in step:
                await self._time_out_question(live, sid, step["default"])
                return step["default"], None, ""
            raise StepFailure(f"timed out after {timeout} s") from None
