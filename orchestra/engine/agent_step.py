"""Agent steps: a streamed chat with the step's provider, tool calls run and fed back.

Tokens are coalesced into `token` events; at most `llm_max_tool_rounds` tool rounds;
retryable provider errors are retried while nothing of the attempt has been shown.
Provider clients are built once per (kind, URL, key) and shared by every run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from orchestra.engine.coalescer import TokenCoalescer
from orchestra.engine.language.policies import read_structured, repair_prompt
from orchestra.engine.language.schemas import describe
from orchestra.engine.live import LiveRun, StepFailure, path_of
from orchestra.engine.llm import (
    ChatMessage,
    ChatResult,
    LLMError,
    TextDelta,
    make_client,
    with_retries,
)
from orchestra.engine.llm.retry import backoff_delay
from orchestra.engine.log import RunGone
from orchestra.engine.sizes import OUTPUT_SETTING, check_question, utf8_size
from orchestra.engine.tools import ToolContext, ToolError
from orchestra.engine.vocabulary import EventKind
from orchestra.errors import OrchestraError
from orchestra.observability import runs as observe
from orchestra.observability.instrument import instrument_client

logger = logging.getLogger("orchestra.engine")


class AgentSteps:
    """Engine part: an agent step's model turns and tool calls."""

    async def _agent_step(
        self, live: LiveRun, step: dict[str, Any], prompt: str
    ) -> tuple[Any, dict[str, int], str]:
        """(output, usage, the last token text, not yet appended: the caller stores it).
        With `output_schema` the output is the answer's JSON value, validated; a mismatch
        is told to the model and asked again, `schema_repairs` times at most."""
        agent = step["agent"]
        if "worker" in agent:
            config = await self.agents.worker(agent["worker"])
            if config is None:
                raise StepFailure(f"The worker '{agent['worker']}' no longer exists.")
        else:
            config = await self.agents.node(agent["node"])
            if config is None:
                raise StepFailure(f"The system node '{agent['node']}' does not exist.")
        if not config.provider_kind or not config.model:
            raise StepFailure(
                f"The {config.kind} '{config.name}' has no provider configured."
                + (" An administrator can set one with PUT /api/v1/agent/node/"
                   f"{config.name}." if config.kind == "node" else "")
            )
        registry = self.registry
        try:
            await registry.load()  # the MCP servers' tools, when their copy is stale
            tools, catalog_names = registry.offer(config.tools)
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
            ask_user=lambda question: self._ask_bounded(live, step["id"], question),
            mcp=live.mcp_sessions(self.settings.mcp_stdio_allowed, self.settings.egress),
        )
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        rounds = self.settings.llm_max_tool_rounds
        schema = step.get("output_schema")
        repairs_left = self.settings.schema_repairs
        tool_rounds = 0
        while True:
            result, pending_text = await self._turn(
                live, step["id"], client, config, messages, tools, output_schema=schema
            )
            if result.usage is not None:
                usage["prompt_tokens"] += result.usage.prompt_tokens
                usage["completion_tokens"] += result.usage.completion_tokens
                if result.usage.cached_tokens:
                    usage["cached_tokens"] = usage.get("cached_tokens", 0) + result.usage.cached_tokens
            if not result.tool_calls:
                if schema is None:
                    return result.text, usage, pending_text
                value, violations = await read_structured(result.text, schema, self.sandbox)
                if not violations:
                    return value, usage, pending_text
                if repairs_left <= 0:
                    await self._emit_tokens(live, step["id"], pending_text)
                    raise StepFailure(
                        "The answer did not match output_schema after "
                        f"{self.settings.schema_repairs} repair rounds: {describe(violations)}"
                    )
                repairs_left -= 1  # tell the model what was wrong and ask again
                await self._emit_tokens(live, step["id"], pending_text)
                messages.append(ChatMessage("assistant", result.text))
                messages.append(ChatMessage("user", repair_prompt(violations, schema)))
                continue
            if tool_rounds == rounds:
                raise StepFailure(f"The model still asked for tools after {rounds} tool rounds.")
            tool_rounds += 1
            messages.append(ChatMessage("assistant", result.text or None, tool_calls=result.tool_calls))
            fail_on_tool_error = (step.get("tools") or {}).get("on_tool_error") == "fail"
            for call in result.tool_calls:
                name = catalog_names.get(call.name, call.name)  # the model may use an encoded name
                content, error = await self._tool(live, step["id"], registry, call, ctx, name)
                if error is not None and fail_on_tool_error:
                    raise StepFailure(f"The tool {name} failed (tools.on_tool_error is 'fail'): {error}")
                messages.append(
                    ChatMessage("tool", content, tool_call_id=call.id, name=call.name)
                )

    async def _ask_bounded(self, live: LiveRun, sid: str, question: str) -> Any:
        """`ask_user`: the model's question, bounded as a prompt is, put to the user."""
        check_question(question, limit=self.settings.prompt_max_bytes)
        return await self._ask(live, sid, question, earlier=live.take_earlier(sid, question))

    async def _emit_tokens(self, live: LiveRun, sid: str, text: str) -> None:
        if text:
            live.writes.submit(self.log.append, live.trace_id, EventKind.TOKEN,
                               live.tagged(sid, {"text": text}), step_id=sid)

    async def _tool(self, live: LiveRun, sid: str, registry, call, ctx: ToolContext,
                    name: str) -> tuple[str, str | None]:
        """Run one tool call (`name`: its catalog name): (what the model reads, the error or
        None). A failing tool becomes an error result for the model."""
        live.writes.submit(
            self.log.append,
            live.trace_id,
            EventKind.TOOL_CALL,
            live.tagged(sid, {"call_id": call.id, "name": name, "arguments": call.arguments}),
            step_id=sid,
        )
        result: str | None = None
        error: str | None = None
        try:
            await self.log.release()  # no pooled connection held while a tool (an MCP server) works
            result = await observe.observed_tool(
                name, registry.run(name, call.arguments, ctx), known=name in registry)
        except ToolError as exc:
            error = exc.message
        except (asyncio.CancelledError, RunGone, StepFailure):
            raise
        except Exception as exc:  # noqa: BLE001 - a broken tool must not end the step
            logger.warning("tool %s raised %r", name, exc)
            error = f"The tool {name} failed: {type(exc).__name__}: {exc}"
        limit = self.settings.step_output_max_bytes
        size = 0 if result is None else utf8_size(result)
        if size > limit:  # stored and sent on: bounded as an output is
            error = (f"The tool {name}'s result is {size} bytes, over the limit of "
                     f"{limit} bytes ({OUTPUT_SETTING}).")
            result = None
        data: dict[str, Any] = {"call_id": call.id, "name": name, "result": result}
        if error is not None:
            data["error"] = error
        live.writes.submit(self.log.append, live.trace_id, EventKind.TOOL_RESULT,
                           live.tagged(sid, data), step_id=sid)
        return (result, None) if error is None else (f"Error: {error}", error)

    async def _turn(
        self, live: LiveRun, sid: str, client, config, messages, tools,
        output_schema: dict[str, Any] | None = None,
    ) -> tuple[ChatResult, str]:
        """One streamed model turn, retried on retryable errors before any token is shown;
        a provider's 429 is waited out (its Retry-After) without using a retry. Each call
        is priced, and reserved under the run's budget first (engine/spend.py).

        Returns the result and, for a final answer (no tool calls), the last buffered
        token text, which the caller appends together with `step_finished`."""
        limit = self.settings.step_output_max_bytes
        model, path = config.model, path_of(sid)

        async def emit(text: str) -> None:
            live.writes.submit(self.log.append, live.trace_id, EventKind.TOKEN,
                               live.tagged(sid, {"text": text}), step_id=sid)

        coalescer = TokenCoalescer(emit, interval=self.token_interval)

        async def attempt() -> ChatResult:
            waits = 0
            while True:  # a 429 is waited out here: it uses no retry (SPEC §12)
                try:
                    return await call()
                except LLMError as exc:
                    if exc.status != 429 or exc.shown:
                        raise
                    if exc.retry_after:
                        self.gate.cool_down(config.provider_id or "", exc.retry_after)
                    waits += 1
                    await self.log.release()
                    await asyncio.sleep(backoff_delay(min(waits, 6), base_delay=self.retry_base_delay,
                                                      max_delay=8.0, retry_after=exc.retry_after))

        async def call() -> ChatResult:
            ticket = await self._wait_for_room(live, config, messages, tools, output_schema)
            tokens = None
            try:
                reservation = await self._reserve(live, path, config, messages, tools, output_schema)
                try:
                    result = await stream()
                except LLMError as exc:
                    self._settle(live, path, reservation, None, billed=exc.status is None)
                    raise
                except BaseException:
                    self._settle(live, path, reservation, None, billed=True)
                    raise
                self._settle(live, path, reservation, result.usage, billed=True)
                if result.usage is not None:
                    tokens = result.usage.prompt_tokens + result.usage.completion_tokens
                return result
            finally:
                await asyncio.shield(self.gate.leave(ticket, tokens))

        async def stream() -> ChatResult:
            await self.log.release()  # no pooled connection held while the model talks
            shown = 0
            result: ChatResult | None = None
            try:
                extra = {"output_schema": output_schema} if output_schema is not None else {}
                async for event in client.stream_chat(model=model, messages=messages, tools=tools,
                                                      max_tokens=self.settings.llm_max_tokens,
                                                      **extra):
                    if isinstance(event, TextDelta) and event.text:
                        shown += utf8_size(event.text)
                        if shown > limit:
                            raise StepFailure(
                                f"The step's output passed the limit of {limit} bytes "
                                f"({OUTPUT_SETTING})."
                            )
                        coalescer.add(event.text)
                    elif isinstance(event, ChatResult):
                        result = event
            except LLMError as exc:
                if shown:  # the user has seen part of this answer: never repeat it
                    error = LLMError(exc.message, status=exc.status, retryable=False)
                    error.shown = True
                    raise error from exc
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
        except StepFailure:
            await coalescer.flush()
            raise
        except BaseException:
            await coalescer.close()
            raise
        if result.tool_calls:
            await coalescer.flush()
            return result, ""
        return result, await coalescer.take()

    async def _client_for(self, config) -> Any:
        """One provider client per (kind, URL, key), reused across steps and runs; built in
        a thread the first time (importing a provider SDK takes ~1–4 s of CPU), holding no
        store connection meanwhile."""
        key = (config.provider_kind, config.provider_base_url, config.provider_api_key)
        client = self._clients.get(key)
        if client is None:
            await self.log.release()
            async with self._clients_lock:
                client = self._clients.get(key)
                if client is None:
                    client = await asyncio.to_thread(self._build_client, config)
                    self._clients[key] = client
        return client

    def _build_client(self, config) -> Any:
        return instrument_client(make_client(
            kind=config.provider_kind,
            api_key=config.provider_api_key,
            base_url=config.provider_base_url,
            timeout=self.settings.llm_timeout,
            egress=self.settings.egress,
        ), config.provider_kind)

    async def _read_upload(self, owner_id: str, file_id: str) -> str:
        try:
            return await self.read_upload(owner_id, file_id)
        except OrchestraError as exc:
            raise ToolError(exc.message) from None
