"""DAG scheduling: a run's steps start as their dependencies succeed, independent ones
concurrently; each step's start, end and output are written through the run's writer."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra.db.models import utcnow
from orchestra.engine.live import HandBack, LiveRun, RunFailed, StepFailure
from orchestra.engine.prompts import render_prompt
from orchestra.engine.vocabulary import EventKind, StepStatus


class Scheduler:
    """Engine part: which steps run next, and one step from start to output."""

    async def _schedule(self, live: LiveRun) -> dict[str, str]:
        """Start steps as their dependencies succeed; independent ones run concurrently.
        While the process stops, no step starts, and a run with nothing but questions in
        flight is handed back."""
        outputs = live.outputs
        started: set[str] = set(outputs)
        tasks: dict[asyncio.Task, str] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                live.writes.check()  # a failed write (the run was deleted, …) ends the run
                if not self.stopping:
                    for step in live.steps:
                        sid = step["id"]
                        if sid in started or not all(d in outputs for d in step.get("depends_on", [])):
                            continue
                        started.add(sid)
                        tasks[loop.create_task(self._step(live, step, outputs))] = sid
                if not tasks:
                    if self.stopping and len(outputs) < len(live.steps):
                        raise HandBack()
                    return outputs
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
                        outputs[sid] = task.result()
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

    async def _step(self, live: LiveRun, step: dict[str, Any], outputs: dict[str, str]) -> str:
        trace_id, sid, writes = live.trace_id, step["id"], live.writes
        prompt = render_prompt(step["prompt"], input=live.input, outputs=outputs)
        earlier = live.take_earlier(sid, prompt) if step["agent"].get("human") else None
        if earlier is None:  # a human step re-waiting on its open question starts nothing
            writes.submit(self._set_step, trace_id, sid, status=StepStatus.RUNNING, started_at=utcnow())
            writes.submit(
                self.log.append, trace_id, EventKind.STEP_STARTED, {"agent": step["agent"], "prompt": prompt},
                step_id=sid,
            )
        pending_text = ""
        try:
            if step["agent"].get("human"):
                output, usage = await self._ask(live, sid, prompt, earlier=earlier), None
            else:
                output, usage, pending_text = await self._agent_step(live, step, prompt)
        except StepFailure as failure:
            writes.submit(self._set_step, trace_id, sid, status=StepStatus.FAILED, error=failure.message,
                          finished_at=utcnow())
            writes.submit(
                self.log.append, trace_id, EventKind.STEP_FAILED, {"error": failure.message}, step_id=sid
            )
            raise
        writes.submit(
            self._set_step, trace_id, sid, status=StepStatus.SUCCEEDED, output=output, usage=usage,
            finished_at=utcnow(),
        )
        last_tokens = [(EventKind.TOKEN, {"text": pending_text}, sid)] if pending_text else []
        finished = (EventKind.STEP_FINISHED, {"output": output, "usage": usage}, sid)
        writes.submit(self.log.append_many, trace_id, last_tokens + [finished])
        return output
