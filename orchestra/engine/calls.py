"""A call step (one agent, human, http, workflow or code call) at an instance path, attempt by attempt
(SPEC §7): `retry` with doubling backoff and `step_retrying` between attempts, each
attempt bounded by `timeout_seconds` and counted against `limits.max_steps`; a human
step's `default` when its wait runs out. The model itself is `agent_step.AgentSteps`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from orchestra.engine.agent_step import AgentSteps
from orchestra.engine.child_step import ChildSteps
from orchestra.engine.code_step import VARIABLES as CODE_VARIABLES
from orchestra.engine.code_step import CodeSteps
from orchestra.engine.http_step import HttpSteps, shown_request
from orchestra.engine.live import LimitReached, LiveRun, StepFailure
from orchestra.engine.model import At, Question, StepDef
from orchestra.engine.questions import Questions
from orchestra.engine.records import Records
from orchestra.engine.reuse import ForkReuse, call_key, code_key, keyed
from orchestra.engine.sizes import render_bounded
from orchestra.engine.spend import Spending
from orchestra.engine.store import RunStore
from orchestra.language import policies
from orchestra.language.expressions import ExpressionError, Scope


def remaining(timeout: float | None, earlier: Question | None) -> float | None:
    """What is left of a step's `timeout_seconds`: a question asked before a take-over or
    a restart has been waiting since it was asked (its stored time), not since now."""
    if timeout is None or earlier is None or earlier.asked_at is None:
        return timeout
    return max(0.0, timeout - (time.time() - earlier.asked_at))


def count_execution(live: LiveRun, step_id: str) -> None:
    """limits.max_steps: the execution past the limit never starts; the run fails."""
    limit = live.options.max_steps
    if limit is not None and live.executions >= limit:
        raise LimitReached(step_id, f"The run reached its limit of {limit} step executions "
                                    "(limits.max_steps).")
    live.executions += 1


class Calls:
    """Agent and human calls, attempt by attempt, with their rows and events."""

    def __init__(self, *, store: RunStore, records: Records, agents: AgentSteps,
                 spending: Spending, questions: Questions, prompt_max_bytes: int, http: HttpSteps,
                 children: ChildSteps, code: CodeSteps, reuse: ForkReuse) -> None:
        self.store = store
        self.reuse = reuse
        self.records = records
        self.agents = agents
        self.spending = spending  # the reservation fields a call's rows carry (SPEC §12)
        self.questions = questions
        self.prompt_max_bytes = prompt_max_bytes
        self.http = http
        self.children = children
        self.code = code

    async def step(self, live: LiveRun, step: StepDef, at: At, variables: dict[str, Any],
                   scope: Scope) -> Any:
        """The scheduler's entry for a call step (StepKind.CALL)."""
        return await self.call(live, step, at, scope)

    async def call(self, live: LiveRun, step: StepDef, at: At, scope: Scope, *,
                   durable: bool = False) -> Any:
        """An agent or human call's attempts at `at`; its output, or StepFailure once the
        last attempt failed (its row and `step_failed` stored). `durable`: return only
        once its end is stored (a foreach item: what a crash must not redo). A fork's call
        that its source already made with the same reuse key is copied instead
        (engine/reuse.py)."""
        with live.calling():  # its waits hold no run slot (LiveRun.holds_slot)
            return await self._call(live, step, at, scope, durable=durable)

    async def _call(self, live: LiveRun, step: StepDef, at: At, scope: Scope, *, durable: bool) -> Any:
        attempt = live.step_attempts.get(at.path, 1)
        prompt, key = await self._prompt_and_key(live, step, at, scope)
        if key is not None and attempt == 1 and self.reuse.applies(live, step):
            found = await self.reuse.take(live, step, at, key, durable=durable)
            if found is not None:
                return found.output
        while True:
            live.step_attempts[at.path] = attempt
            try:
                count_execution(live, at.step_id)
                output, usage, pending_text = await self._attempt(live, step, at, scope, attempt, prompt)
                break
            except StepFailure as failure:
                if attempt < step.max_attempts:
                    delay = policies.retry_delay(step.backoff_seconds, attempt)
                    # an HTTP 429/503's Retry-After: the next attempt waits at least that
                    delay = max(delay, getattr(failure, "retry_after", None) or 0)
                    self.records.retrying(live, at, attempt, failure.message, delay)
                    await self.store.release()
                    if delay:
                        with live.waiting_for():  # no run slot held through the delay
                            await asyncio.sleep(delay)
                    attempt += 1
                    continue
                stored = self.records.failed(live, at, failure.message,
                                             self.spending.fields(live, at.path))
                if durable:
                    await self.records.stored(live, stored)
                raise
        stored = self.records.call_succeeded(live, at, output, usage, pending_text,
                                             structured=step.structured,
                                             spend=self.spending.fields(live, at.path), key=key)
        if durable:
            await self.records.stored(live, stored)
        return output

    async def _prompt_and_key(self, live: LiveRun, step: StepDef, at: At, scope: Scope
                              ) -> tuple[str | None, str | None]:
        """An agent or human call's rendered prompt and its reuse key; (None, None) for
        other calls, and when the prompt does not render or the agent cannot be found
        (each attempt then fails as it would); a code step's key (no prompt)."""
        if step.code is not None:
            return None, code_key(step, {name: scope.variables[name] for name in CODE_VARIABLES
                                         if name in scope.variables})
        if not keyed(step):
            return None, None
        try:
            prompt = await render_bounded(step.prompt, scope, limit=self.prompt_max_bytes,
                                          where=at.path)  # checked before any event carries it
        except (ExpressionError, StepFailure):
            return None, None
        if step.human:
            return prompt, call_key(step, prompt, live.files, None)
        agent = await self.agents.fingerprint(step)
        return prompt, None if agent is None else call_key(step, prompt, live.files, agent)

    async def _attempt(self, live: LiveRun, step: StepDef, at: At, scope: Scope,
                       attempt: int, prompt: str | None) -> tuple[Any, dict[str, int] | None, str]:
        """One attempt: (output, usage, last token text). StepFailure when it fails,
        `timed out after N s` past timeout_seconds (a human step's default, if it has
        one, is then its output). `prompt`: the rendered prompt, when it rendered."""
        if step.http is not None or step.workflow is not None or step.code is not None:
            return await self._action(live, step, at, scope, attempt), None, ""
        if prompt is None:
            try:
                prompt = await render_bounded(step.prompt, scope, limit=self.prompt_max_bytes,
                                              where=at.path)  # checked before any event carries it
            except ExpressionError as exc:
                raise StepFailure(exc.message) from None
        human = step.human
        earlier = live.take_earlier(at, prompt) if human else None
        if earlier is None:  # a human step re-waiting on its open question starts nothing
            # A prompt is stored once: a human step's question is in its `reply_requested`.
            started = {"agent": step.agent.as_json()} | ({} if human else {"prompt": prompt})
            self.records.attempt_started(live, at, attempt, started)
        timeout = step.timeout_seconds
        try:
            async with asyncio.timeout(remaining(timeout, earlier)):
                if human:
                    return await self.questions.ask(live, at, prompt, earlier=earlier,
                                                    schema=step.output_schema), None, ""
                return await self.agents.run(live, step, at, prompt)
        except TimeoutError:
            if human and step.has_default:
                await self.questions.time_out(live, at, step.default)
                return step.default, None, ""
            raise StepFailure(f"timed out after {timeout} s") from None

    async def _action(self, live: LiveRun, step: StepDef, at: At, scope: Scope, attempt: int) -> Any:
        """One attempt of an http, workflow (SPEC §14) or code (§17) step: `step_started`,
        then the request, the child run or the code, bounded by the step's timeout_seconds."""
        if step.http is not None:
            self.records.attempt_started(live, at, attempt, {"http": shown_request(step.http)})
        elif step.code is not None:
            started = await self.code.clock(live, at)  # the instant its code sees as now
            self.records.attempt_started(live, at, attempt, {}, started_at=started)
        try:
            async with asyncio.timeout(step.timeout_seconds):
                if step.http is not None:
                    return await self.http.attempt(live, step, at, scope)
                if step.code is not None:
                    return await self.code.attempt(live, step, at, scope)
                # the child run is stored with the attempt's `step_started` (one write)
                return await self.children.attempt(live, step, at, scope, attempt, {"workflow": step.workflow})
        except TimeoutError:
            raise StepFailure(f"timed out after {step.timeout_seconds} s") from None
