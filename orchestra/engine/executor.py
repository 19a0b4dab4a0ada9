"""Runs a template's steps as engine-owned asyncio tasks, writing the event log as it goes.

One `Engine` per process (`engine_of(core)`). A run is a task that starts every step
whose dependencies have succeeded, concurrently, until all are done or one fails. An
agent step is a streamed chat with its provider (tokens coalesced into `token` events,
tool calls run and fed back, at most `llm_max_tool_rounds` rounds, retryable provider
errors retried while nothing of the attempt has been shown). A human step, like the
`ask_user` tool, emits `reply_requested` and waits for `Engine.reply`. Requests that
start, cancel or answer a run never own it: a client hanging up changes nothing.

A run's store writes (row updates, events) go through its `RunWriter`, in order, so
the run does not wait on the store between steps; a run waits for them to be stored
before it ends, and a reply request before it answers.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from orchestra.db.models import RunEvent, RunStep, WorkflowRun, utcnow
from orchestra.engine.events import EventLog, RunGone, RunWriter, TokenCoalescer
from orchestra.engine.llm import (
    ChatMessage,
    ChatResult,
    LLMError,
    TextDelta,
    make_client,
    with_retries,
)
from orchestra.engine.tools import ToolContext, ToolError, ToolRegistry
from orchestra.errors import ConflictError, OrchestraError

logger = logging.getLogger("orchestra.engine")

PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
ACTIVE = ("queued", "running", "waiting_reply")
STORE_POLL_SECONDS = 1.0  # how often a waiting step looks for a reply made by another process


class StepFailure(Exception):
    """A step failed for a reason the user should read (a provider's own message, …)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _RunFailed(Exception):
    def __init__(self, step_id: str, message: str) -> None:
        super().__init__(message)
        self.step_id = step_id
        self.message = message


@dataclass
class PendingReply:
    request_id: str
    step_id: str
    prompt: str
    future: asyncio.Future


@dataclass
class LiveRun:
    """A run executing in this process."""

    trace_id: str
    owner_id: str
    input: str
    files: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    task: asyncio.Task | None = None
    pending: dict[str, PendingReply] = field(default_factory=dict)
    writes: RunWriter = field(default_factory=RunWriter)  # its store writes, in order
    stop_status: str = "cancelled"  # or "interrupted"
    stop_reason: str = "The run was cancelled."


def render_prompt(template: str, *, input: str, outputs: dict[str, str]) -> str:
    """Fill `{{input}}` and `{{steps.<id>.output}}`; the template was validated before."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name == "input":
            return input
        if name.startswith("steps.") and name.endswith(".output"):
            return outputs.get(name[len("steps."):-len(".output")], "")
        return match.group(0)

    return PLACEHOLDER.sub(value, template)


class Engine:
    """Owns the run tasks and the event log of this process."""

    def __init__(
        self,
        core: Any,
        *,
        registry: ToolRegistry | None = None,
        token_interval: float = 0.05,
        retry_base_delay: float = 0.5,
    ) -> None:
        self.core = core
        self.settings = core.settings
        self.log = EventLog(core.db)
        self.registry = registry
        self.token_interval = token_interval
        self.retry_base_delay = retry_base_delay
        self.runs: dict[str, LiveRun] = {}
        self._clients: dict[tuple, Any] = {}
        self._clients_lock = asyncio.Lock()
        self.stopping = False

    # -- lifecycle --------------------------------------------------------------------------
    def is_live(self, trace_id: str) -> bool:
        return trace_id in self.runs

    def start(self, run: WorkflowRun) -> LiveRun:
        """Execute a stored `queued` run in a task owned by the engine."""
        if self.stopping:
            raise ConflictError("The server is shutting down; start the run again shortly.")
        live = LiveRun(run.trace_id, run.owner_id, run.input or "", list(run.files or []), run.steps)
        self.runs[run.trace_id] = live
        live.task = asyncio.get_running_loop().create_task(
            self._run(live), name=f"run-{run.trace_id}"
        )
        return live

    async def cancel(
        self, trace_id: str, *, status: str = "cancelled", reason: str = "The run was cancelled."
    ) -> bool:
        """Stop a live run and wait for its terminal event; False when it is not live here."""
        live = self.runs.get(trace_id)
        if live is None or live.task is None:
            return False
        live.stop_status, live.stop_reason = status, reason
        live.task.cancel()
        await asyncio.wait({live.task}, timeout=10)
        return True

    async def cancel_owner(self, user_id: str, *, reason: str) -> None:
        """Cancel every live run of a user (the user is being deleted)."""
        for live in [r for r in self.runs.values() if r.owner_id == user_id]:
            await self.cancel(live.trace_id, reason=reason)

    async def stop(self) -> None:
        """Server shutdown: end every live run as `interrupted`, then close clients."""
        self.stopping = True
        lives = list(self.runs.values())
        for live in lives:
            live.stop_status, live.stop_reason = "interrupted", "The server stopped during the run."
            if live.task is not None:
                live.task.cancel()
        tasks = [live.task for live in lives if live.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        for client in self._clients.values():
            try:
                await client.aclose()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._clients.clear()

    # -- replies ----------------------------------------------------------------------------
    def pending_requests(self, trace_id: str) -> list[PendingReply] | None:
        """The questions a live run waits on (oldest first); None when not live here."""
        live = self.runs.get(trace_id)
        return None if live is None else list(live.pending.values())

    async def reply(self, trace_id: str, *, content: str, request_id: str | None) -> PendingReply:
        """Answer a waiting question of a live run (the oldest one unless `request_id`)."""
        live = self.runs[trace_id]
        if not live.pending:
            raise ConflictError("The run is not waiting for a reply.")
        if request_id is None:
            request_id = next(iter(live.pending))
        pending = live.pending.pop(request_id, None)
        if pending is None:
            raise ConflictError(
                f"The request '{request_id}' is not waiting for a reply (stale or unknown).",
                detail={"pending": list(live.pending)},
            )
        writes = live.writes
        if not live.pending:
            writes.submit(self._set_run, trace_id, status="running")
        writes.submit(self._set_step, trace_id, pending.step_id, status="running")
        stored = writes.submit(
            self.log.append,
            trace_id,
            "reply_received",
            {"request_id": request_id, "content": content},
            step_id=pending.step_id,
        )
        await asyncio.shield(stored)
        if not pending.future.done():
            pending.future.set_result(content)
        return pending

    # -- the run ----------------------------------------------------------------------------
    async def _run(self, live: LiveRun) -> None:
        trace_id, writes = live.trace_id, live.writes
        try:
            writes.submit(self._set_run, trace_id, status="running", started_at=utcnow())
            writes.submit(
                self.log.append,
                trace_id,
                "run_started",
                {"status": "running", "input": live.input, "steps": [s["id"] for s in live.steps]},
            )
            outputs = await self._schedule(live)
            writes.submit(self._set_run, trace_id, status="succeeded", finished_at=utcnow())
            final = outputs.get(live.steps[-1]["id"]) if live.steps else None
            writes.submit(
                self.log.append, trace_id, "run_finished", {"status": "succeeded", "output": final}
            )
            await writes.drain()
        except _RunFailed as failure:
            await self._end(live, "failed", "run_failed", failure.message, step_id=failure.step_id)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            kind = "run_failed" if live.stop_status == "interrupted" else "run_cancelled"
            await self._end(live, live.stop_status, kind, live.stop_reason)
        except RunGone:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug must still end the run visibly
            logger.exception("run %s crashed", trace_id)
            await self._end(live, "failed", "run_failed", f"Internal error: {type(exc).__name__}.")
        finally:
            await writes.settle()
            for pending in live.pending.values():
                if not pending.future.done():
                    pending.future.cancel()
            self.runs.pop(trace_id, None)
            self.log.forget(trace_id)

    async def _end(
        self, live: LiveRun, status: str, kind: str, message: str, *, step_id: str | None = None
    ) -> None:
        """Record a run's unhappy end: steps, run row, terminal event (best effort if gone).

        The run's queued writes land first; then these are written directly."""
        trace_id = live.trace_id
        await live.writes.settle()
        now = utcnow()
        try:
            last = await self.log.last_event(trace_id)
            if last is not None and last.terminal:  # it ended just before the stop
                return
            await self.core.db.aexecute(
                RunStep.update(status=status if status != "failed" else "cancelled", finished_at=now)
                .where((RunStep.run == trace_id) & RunStep.status.in_(["running", "waiting_reply"]))
            )
            await self.core.db.aexecute(
                RunStep.update(status="skipped").where(
                    (RunStep.run == trace_id) & (RunStep.status == "pending")
                )
            )
            await self._set_run(trace_id, status=status, error=message, finished_at=now)
            data: dict[str, Any] = {"status": status}
            data["reason" if status != "failed" else "error"] = message
            if step_id:
                data["failed_step"] = step_id
            await self.log.append(trace_id, kind, data)
        except RunGone:
            pass
        except Exception:  # noqa: BLE001 - the store may be closing; the restart marks it
            logger.exception("could not record the end of run %s", trace_id)

    async def _schedule(self, live: LiveRun) -> dict[str, str]:
        """Start steps as their dependencies succeed; independent ones run concurrently."""
        outputs: dict[str, str] = {}
        started: set[str] = set()
        tasks: dict[asyncio.Task, str] = {}
        try:
            while True:
                live.writes.check()  # a failed write (the run was deleted, …) ends the run
                for step in live.steps:
                    sid = step["id"]
                    if sid in started or not all(d in outputs for d in step.get("depends_on", [])):
                        continue
                    started.add(sid)
                    task = asyncio.get_running_loop().create_task(self._step(live, step, outputs))
                    tasks[task] = sid
                if not tasks:
                    return outputs
                await self.log.release()
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                failure: _RunFailed | None = None
                for task in done:
                    sid = tasks.pop(task)
                    error = task.exception()
                    if error is None:
                        outputs[sid] = task.result()
                    elif isinstance(error, StepFailure):
                        failure = failure or _RunFailed(sid, f"Step '{sid}' failed: {error.message}")
                    else:
                        raise error
                if failure is not None:
                    raise failure
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _step(self, live: LiveRun, step: dict[str, Any], outputs: dict[str, str]) -> str:
        trace_id, sid, writes = live.trace_id, step["id"], live.writes
        prompt = render_prompt(step["prompt"], input=live.input, outputs=outputs)
        writes.submit(self._set_step, trace_id, sid, status="running", started_at=utcnow())
        writes.submit(
            self.log.append, trace_id, "step_started", {"agent": step["agent"], "prompt": prompt},
            step_id=sid,
        )
        pending_text = ""
        try:
            if step["agent"].get("human"):
                output, usage = await self._ask(live, sid, prompt), None
            else:
                output, usage, pending_text = await self._agent_step(live, step, prompt)
        except StepFailure as failure:
            writes.submit(self._set_step, trace_id, sid, status="failed", error=failure.message,
                          finished_at=utcnow())
            writes.submit(
                self.log.append, trace_id, "step_failed", {"error": failure.message}, step_id=sid
            )
            raise
        writes.submit(
            self._set_step, trace_id, sid, status="succeeded", output=output, usage=usage,
            finished_at=utcnow(),
        )
        last_tokens = [("token", {"text": pending_text}, sid)] if pending_text else []
        finished = ("step_finished", {"output": output, "usage": usage}, sid)
        writes.submit(self.log.append_many, trace_id, last_tokens + [finished])
        return output

    # -- agent steps ------------------------------------------------------------------------
    async def _agent_step(
        self, live: LiveRun, step: dict[str, Any], prompt: str
    ) -> tuple[str, dict[str, int], str]:
        """(output, usage, the last token text, not yet appended: the caller stores it)."""
        from orchestra.services.agents import agent_cache, tool_registry

        agent = step["agent"]
        cache = agent_cache(self.core)
        if "worker" in agent:
            config = await cache.worker(agent["worker"])
            if config is None:
                raise StepFailure(f"The worker '{agent['worker']}' no longer exists.")
        else:
            config = await cache.node(agent["node"])
            if config is None:
                raise StepFailure(f"The system node '{agent['node']}' does not exist.")
        if not config.provider_kind or not config.model:
            raise StepFailure(
                f"The {config.kind} '{config.name}' has no provider configured."
                + (" An administrator can set one with PUT /api/v1/agent/node/"
                   f"{config.name}." if config.kind == "node" else "")
            )
        registry = self.registry or tool_registry(self.core)
        try:
            tools = registry.specs(config.tools)
            client = await self._client_for(config)
        except (ToolError, LLMError) as exc:
            raise StepFailure(exc.message) from None
        system = "\n\n".join(p for p in (config.system_prompt, config.skill_instructions) if p)
        user_text = prompt
        if live.files:
            listed = ", ".join(f"{f['file_id']} ({f.get('filename', '')})" for f in live.files)
            user_text += f"\n\nAttached files (read them with read_upload by file_id): {listed}"
        messages = ([ChatMessage("system", system)] if system else []) + [
            ChatMessage("user", user_text)
        ]
        ctx = ToolContext(
            user_id=live.owner_id,
            trace_id=live.trace_id,
            step_id=step["id"],
            read_upload=lambda file_id: self._read_upload(live.owner_id, file_id),
            ask_user=lambda question: self._ask(live, step["id"], question),
        )
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        rounds = self.settings.llm_max_tool_rounds
        for round_number in range(rounds + 1):
            result, pending_text = await self._turn(
                live, step["id"], client, config.model, messages, tools
            )
            if result.usage is not None:
                usage["prompt_tokens"] += result.usage.prompt_tokens
                usage["completion_tokens"] += result.usage.completion_tokens
            if not result.tool_calls:
                return result.text, usage, pending_text
            if round_number == rounds:
                raise StepFailure(f"The model still asked for tools after {rounds} tool rounds.")
            messages.append(ChatMessage("assistant", result.text or None, tool_calls=result.tool_calls))
            for call in result.tool_calls:
                content = await self._tool(live, step["id"], registry, call, ctx)
                messages.append(
                    ChatMessage("tool", content, tool_call_id=call.id, name=call.name)
                )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _tool(self, live: LiveRun, sid: str, registry, call, ctx: ToolContext) -> str:
        """Run one tool call; a failing tool becomes an error result for the model."""
        live.writes.submit(
            self.log.append,
            live.trace_id,
            "tool_call",
            {"call_id": call.id, "name": call.name, "arguments": call.arguments},
            step_id=sid,
        )
        result: str | None = None
        error: str | None = None
        try:
            result = await registry.run(call.name, call.arguments, ctx)
        except ToolError as exc:
            error = exc.message
        except (asyncio.CancelledError, RunGone, StepFailure):
            raise
        except Exception as exc:  # noqa: BLE001 - a broken tool must not end the step
            logger.warning("tool %s raised %r", call.name, exc)
            error = f"The tool {call.name} failed: {type(exc).__name__}: {exc}"
        data: dict[str, Any] = {"call_id": call.id, "name": call.name, "result": result}
        if error is not None:
            data["error"] = error
        live.writes.submit(self.log.append, live.trace_id, "tool_result", data, step_id=sid)
        return result if error is None else f"Error: {error}"

    async def _turn(
        self, live: LiveRun, sid: str, client, model: str, messages, tools
    ) -> tuple[ChatResult, str]:
        """One streamed model turn, retried on retryable errors before any token is shown.

        Returns the result and, for a final answer (no tool calls), the last buffered
        token text, which the caller appends together with `step_finished`."""

        async def emit(text: str) -> None:
            live.writes.submit(self.log.append, live.trace_id, "token", {"text": text}, step_id=sid)

        coalescer = TokenCoalescer(emit, interval=self.token_interval)

        async def attempt() -> ChatResult:
            await self.log.release()  # no pooled connection held while the model talks
            shown = False
            result: ChatResult | None = None
            try:
                async for event in client.stream_chat(model=model, messages=messages, tools=tools):
                    if isinstance(event, TextDelta) and event.text:
                        coalescer.add(event.text)
                        shown = True
                    elif isinstance(event, ChatResult):
                        result = event
            except LLMError as exc:
                if shown:  # the user has seen part of this answer: never repeat it
                    raise LLMError(exc.message, status=exc.status, retryable=False) from exc
                raise
            if result is None:
                raise LLMError("The provider's stream ended without a result.", retryable=not shown)
            return result

        try:
            result = await with_retries(
                attempt,
                attempts=max(1, self.settings.llm_retries + 1),
                base_delay=self.retry_base_delay,
            )
        except LLMError as exc:
            await coalescer.flush()
            raise StepFailure(exc.message) from None
        except BaseException:
            await coalescer.close()
            raise
        if result.tool_calls:
            await coalescer.flush()
            return result, ""
        return result, await coalescer.take()

    async def _client_for(self, config) -> Any:
        """`_client`, built in a thread the first time: importing a provider SDK takes ~1 s
        (openai) to ~4 s (anthropic) of CPU that must not stall every stream and request."""
        key = (config.provider_kind, config.provider_base_url, config.provider_api_key)
        client = self._clients.get(key)
        if client is None:
            async with self._clients_lock:
                client = self._clients.get(key)
                if client is None:
                    client = await asyncio.to_thread(self._build_client, config)
                    self._clients[key] = client
        return client

    def _client(self, config) -> Any:
        """One provider client per (kind, URL, key), reused across steps and runs."""
        key = (config.provider_kind, config.provider_base_url, config.provider_api_key)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = self._build_client(config)
        return client

    def _build_client(self, config) -> Any:
        return make_client(
            kind=config.provider_kind,
            api_key=config.provider_api_key,
            base_url=config.provider_base_url,
            timeout=self.settings.llm_timeout,
        )

    async def _read_upload(self, owner_id: str, file_id: str) -> str:
        from orchestra.services import uploads

        try:
            return await uploads.read_text(self.core, owner_id=owner_id, file_id=file_id)
        except OrchestraError as exc:
            raise ToolError(exc.message) from None

    # -- human in the loop ------------------------------------------------------------------
    async def _ask(self, live: LiveRun, sid: str, prompt: str) -> str:
        """Emit `reply_requested`, move the run to `waiting_reply`, wait for the answer."""
        request_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        pending = PendingReply(request_id, sid, prompt, future)
        live.pending[request_id] = pending
        try:
            writes = live.writes
            writes.submit(self._set_run, live.trace_id, status="waiting_reply")
            writes.submit(self._set_step, live.trace_id, sid, status="waiting_reply")
            await asyncio.shield(writes.submit(
                self.log.append, live.trace_id, "reply_requested",
                {"request_id": request_id, "prompt": prompt}, step_id=sid,
            ))
            return await self._wait_reply(live, pending)
        finally:
            live.pending.pop(request_id, None)

    async def _wait_reply(self, live: LiveRun, pending: PendingReply) -> str:
        """The reply, from `Engine.reply` here or (several workers) from the store."""
        while True:
            await self.log.release()
            try:
                return await asyncio.wait_for(asyncio.shield(pending.future), STORE_POLL_SECONDS)
            except (asyncio.TimeoutError, TimeoutError):
                pass
            rows = await self.core.db.list(
                RunEvent.select(RunEvent.data)
                .where(
                    (RunEvent.run == live.trace_id)
                    & (RunEvent.kind == "reply_received")
                    & RunEvent.data.contains(pending.request_id)
                )
                .limit(1)
            )
            if rows and rows[0].data.get("request_id") == pending.request_id:
                live.pending.pop(pending.request_id, None)
                return str(rows[0].data.get("content", ""))
            last = await self.log.last_event(live.trace_id)
            if last is None or last.terminal:
                raise RunGone(f"run {live.trace_id} was ended elsewhere")

    # -- store helpers ----------------------------------------------------------------------
    async def _set_run(self, trace_id: str, **values: Any) -> None:
        await self.core.db.aexecute(WorkflowRun.update(**values).where(WorkflowRun.trace_id == trace_id))

    async def _set_step(self, trace_id: str, step_id: str, **values: Any) -> None:
        await self.core.db.aexecute(
            RunStep.update(**values).where((RunStep.run == trace_id) & (RunStep.step_id == step_id))
        )


def engine_of(core: Any) -> Engine:
    """The one Engine of this Core (kept in core.extras["engine"]), created on first use."""
    engine = core.extras.get("engine")
    if engine is None:
        engine = core.extras["engine"] = Engine(core)

        async def _on_user_deleted(user_id: str) -> None:
            await engine.cancel_owner(user_id, reason="The run's user was deleted.")

        core.extras.setdefault("on_user_deleted", []).append(_on_user_deleted)
    return engine


async def stop_engine(core: Any) -> None:
    """Stop the Core's engine, if one was started (before the Core closes)."""
    engine = core.extras.get("engine")
    if engine is not None:
        await engine.stop()
