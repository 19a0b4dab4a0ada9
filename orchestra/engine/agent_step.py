"""Agent steps: a streamed chat with the step's provider, tool calls run and fed back.

Tokens are coalesced into `token` events; at most `llm_max_tool_rounds` tool rounds;
retryable provider errors are retried while nothing of the attempt has been shown.
Provider clients are built once per provider and shared by every run (`llm/clients.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from orchestra import redaction
from orchestra.engine.coalescer import TokenCoalescer
from orchestra.engine.live import LiveRun, StepFailure
from orchestra.engine.llm import (
    ChatMessage,
    ChatResult,
    LLMError,
    TextDelta,
    make_client,
    with_retries,
)
from orchestra.engine.llm.clients import ProviderClients
from orchestra.engine.llm.instrumented import instrument_client
from orchestra.engine.llm.retry import backoff_delay
from orchestra.engine.model import At, StepDef
from orchestra.engine.questions import Questions
from orchestra.engine.records import Records
from orchestra.engine.reuse import agent_fingerprint
from orchestra.engine.sizes import OUTPUT_SETTING, check_question, utf8_size
from orchestra.engine.spend import Spending
from orchestra.engine.store import RunStore
from orchestra.engine.store.events import RunGone
from orchestra.engine.tools.base import ToolContext, ToolError, ToolRegistry
from orchestra.errors import OrchestraError
from orchestra.language.policies import read_structured, repair_prompt
from orchestra.language.sandbox import Sandbox
from orchestra.language.schemas import describe
from orchestra.observability import metrics
from orchestra.observability import runs as observe
from orchestra.settings import Settings
from orchestra.vocabulary import EventKind

logger = logging.getLogger("orchestra.engine")


def _first_messages(live: LiveRun, config: Any, prompt: str) -> list[ChatMessage]:
    """The system prompt (the agent's and its skills'), then the prompt with the run's
    attached files listed."""
    system = "\n\n".join(p for p in (config.system_prompt, config.skill_instructions) if p)
    user_text = prompt
    if live.files:
        listed = ", ".join(f"{f['file_id']} ({f.get('filename', '')})" for f in live.files)
        user_text += f"\n\nAttached files (read them with read_upload by file_id): {listed}"
    return ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", user_text)]


async def _streamed(stream: Any, coalescer: TokenCoalescer, limit: int) -> ChatResult:
    """One streamed answer: its text goes to `coalescer` as it comes, bounded by `limit`
    bytes (StepFailure past it). An error after text was shown is not retryable: the
    user has seen part of this answer, which must never be repeated."""
    shown = 0
    result: ChatResult | None = None
    try:
        async for event in stream:
            if isinstance(event, TextDelta) and event.text:
                shown += utf8_size(event.text)
                if shown > limit:
                    raise StepFailure(
                        f"The step's output passed the limit of {limit} bytes ({OUTPUT_SETTING})."
                    )
                coalescer.add(event.text)
            elif isinstance(event, ChatResult):
                result = event
    except LLMError as exc:
        if shown:
            raise LLMError(exc.message, status=exc.status, retryable=False) from exc
        raise
    if result is None:
        raise LLMError("The provider's stream ended without a result.", retryable=not shown)
    return result


def provider_said(config: Any, message: str) -> str:
    """A provider's error as a step's: which provider (and model) it came from first."""
    name = getattr(config, "provider_name", None)
    if not name:
        return message
    return f"Provider '{name}' (model {config.model}): {message}"


class AgentResolver(Protocol):
    """What the engine asks for an agent step's configuration (services' AgentCache)."""

    async def worker(self, worker_id: str) -> Any: ...

    async def node(self, name: str) -> Any: ...


class AgentSteps:
    """An agent step's model turns and tool calls: the one place a step calls a model."""

    def __init__(self, settings: Settings, *, store: RunStore, records: Records,
                 questions: Questions, agents: AgentResolver, registry: ToolRegistry,
                 read_upload: Callable[[str, str], Awaitable[str]], sandbox: Sandbox,
                 spending: Spending, token_interval: float = 0.05,
                 retry_base_delay: float = 0.5) -> None:
        self.settings = settings
        self.store = store
        self.records = records
        self.questions = questions
        self.agents = agents
        self.registry = registry
        self.read_upload = read_upload
        self.sandbox = sandbox
        self.spending = spending
        self.token_interval = token_interval
        self.retry_base_delay = retry_base_delay
        self.clients = ProviderClients(self.build_client)  # by provider; a rotated key closes

    async def run(self, live: LiveRun, step: StepDef, at: At, prompt: str
                  ) -> tuple[Any, dict[str, int], str]:
        """(output, usage, the last token text, not yet appended: the caller stores it).
        With `output_schema` the output is the answer's JSON value, validated; a mismatch
        is told to the model and asked again, `schema_repairs` times at most."""
        config = await self._config(step)
        registry = self.registry
        try:
            await registry.load()  # the MCP servers' tools, when their copy is stale
            tools, catalog_names = registry.offer(config.tools, live.workspace_id)
            client = await self.client_for(config)
        except (ToolError, LLMError) as exc:
            raise StepFailure(exc.message) from None
        messages = _first_messages(live, config, prompt)
        ctx = ToolContext(
            user_id=live.owner_id,
            trace_id=live.trace_id,
            step_id=step.id,
            read_upload=lambda file_id: self._read_upload(live.owner_id, file_id),
            ask_user=lambda question: self._ask_bounded(live, at, question),
            mcp=live.mcp_sessions(self.settings.mcp_stdio_allowed, self.settings.egress),
        )
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        rounds = self.settings.llm_max_tool_rounds
        schema = step.output_schema
        repairs_left = self.settings.schema_repairs
        tool_rounds = 0
        while True:
            result, pending_text = await self._turn(
                live, at, client, config, messages, tools, output_schema=schema
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
                self._emit_tokens(live, at, pending_text)
                if repairs_left <= 0:
                    raise StepFailure(
                        "The answer did not match output_schema after "
                        f"{self.settings.schema_repairs} repair rounds: {describe(violations)}"
                    )
                repairs_left -= 1  # tell the model what was wrong and ask again
                messages.append(ChatMessage("assistant", result.text))
                messages.append(ChatMessage("user", repair_prompt(violations, schema)))
                continue
            if tool_rounds == rounds:
                raise StepFailure(f"The model still asked for tools after {rounds} tool rounds.")
            tool_rounds += 1
            messages.append(ChatMessage("assistant", result.text or None, tool_calls=result.tool_calls))
            for call in result.tool_calls:
                name = catalog_names.get(call.name, call.name)  # the model may use an encoded name
                messages.append(await self._tool_message(live, at, step, ctx, call, name))

    async def fingerprint(self, step: StepDef) -> str | None:
        """What of the step's worker or node configuration its answer depends on
        (engine/reuse.py); None when it cannot answer (the attempt then fails)."""
        try:
            return agent_fingerprint(await self._config(step))
        except StepFailure:
            return None

    async def _config(self, step: StepDef) -> Any:
        """The step's worker or node configuration; StepFailure when it cannot answer."""
        agent = step.agent
        if agent.worker is not None:
            config = await self.agents.worker(agent.worker)
            if config is None:
                raise StepFailure(f"The worker '{agent.worker}' no longer exists.")
        else:
            config = await self.agents.node(agent.node)
            if config is None:
                raise StepFailure(f"The system node '{agent.node}' does not exist.")
        if not config.provider_kind or not config.model:
            raise StepFailure(
                f"The {config.kind} '{config.name}' has no provider configured."
                + (" An administrator can set one with PUT /api/v1/agent/node/"
                   f"{config.name}." if config.kind == "node" else "")
            )
        return config

    async def _tool_message(self, live: LiveRun, at: At, step: StepDef, ctx: ToolContext,
                            call: Any, name: str) -> ChatMessage:
        """Run one tool call; the message the model reads about it. A failed call fails
        the step under `on_tool_error: fail`."""
        content, error = await self._tool(live, at, self.registry, call, ctx, name)
        if error is not None and step.fail_on_tool_error:
            raise StepFailure(f"The tool {name} failed ({step.fail_on_tool_error} is 'fail'): {error}")
        return ChatMessage("tool", content, tool_call_id=call.id, name=call.name)

    async def _ask_bounded(self, live: LiveRun, at: At, question: str) -> Any:
        """`ask_user`: the model's question, bounded as a prompt is, put to the user."""
        check_question(question, limit=self.settings.prompt_max_bytes)
        return await self.questions.ask(live, at, question, earlier=live.take_earlier(at, question))

    def _emit_tokens(self, live: LiveRun, at: At, text: str) -> None:
        if text:
            self.records.event(live, at, EventKind.TOKEN, {"text": text})

    async def _tool(self, live: LiveRun, at: At, registry, call, ctx: ToolContext,
                    name: str) -> tuple[str, str | None]:
        """Run one tool call (`name`: its catalog name): (what the model reads, the error or
        None). A failing tool becomes an error result for the model."""
        self.records.event(live, at, EventKind.TOOL_CALL,
                           {"call_id": call.id, "name": name, "arguments": call.arguments})
        result: str | None = None
        error: str | None = None
        try:
            await self.store.release()  # no pooled connection held while a tool (an MCP server) works
            result = await observe.observed_tool(
                name, registry.run(name, call.arguments, ctx, live.workspace_id),
                known=registry.has(name, live.workspace_id))
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
            error = redaction.scrub_text(error)  # an MCP server's header or env value it quoted (SPEC §15b)
            data["error"] = error
        self.records.event(live, at, EventKind.TOOL_RESULT, data)
        return (result, None) if error is None else (f"Error: {error}", error)

    async def _turn(
        self, live: LiveRun, at: At, client, config, messages, tools,
        output_schema: dict[str, Any] | None = None,
    ) -> tuple[ChatResult, str]:
        """One streamed model turn, retried on retryable errors before any token is shown;
        a provider's 429 is waited out (its Retry-After) without using a retry (SPEC §12).

        Returns the result and, for a final answer (no tool calls), the last buffered
        token text, which the caller appends together with `step_finished`."""
        limit = self.settings.step_output_max_bytes

        async def emit(text: str) -> None:
            self.records.event(live, at, EventKind.TOKEN, {"text": text})

        coalescer = TokenCoalescer(emit, interval=self.token_interval)

        extra = {"output_schema": output_schema} if output_schema is not None else {}

        async def call() -> ChatResult:
            await self.store.release()  # no pooled connection held while the model talks
            return await _streamed(client.stream_chat(
                model=config.model, messages=messages, tools=tools,
                max_tokens=self.settings.llm_max_tokens, **extra), coalescer, limit)

        async def attempt() -> ChatResult:
            waits, asked = 0, time.time()
            while True:
                try:
                    return await self._priced(live, at, config, messages, tools, output_schema, call,
                                              requested_at=asked)
                except LLMError as exc:
                    if exc.status != 429 or not exc.retryable:
                        raise
                    metrics.provider_rate_limited(config.provider_name or "")
                    if exc.retry_after:
                        self.spending.gate.cool_down(config.provider_id or "", exc.retry_after)
                    waits += 1
                    await self.store.release()
                    await asyncio.sleep(backoff_delay(min(waits, 6), base_delay=self.retry_base_delay,
                                                      max_delay=8.0, retry_after=exc.retry_after))

        try:
            result = await with_retries(
                attempt,
                attempts=max(1, self.settings.llm_retries + 1),
                base_delay=self.retry_base_delay,
            )
        except LLMError as exc:
            await coalescer.flush()
            raise StepFailure(provider_said(config, exc.message)) from None
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

    async def _priced(self, live: LiveRun, at: At, config, messages, tools, output_schema,
                      call: Callable[[], Awaitable[ChatResult]], *, requested_at: float) -> ChatResult:
        """One model call inside the provider's limits and the run's budget: room under
        the limits first (in its place since `requested_at`), then its reservation, then
        the call, then its cost settled."""
        spending = self.spending
        ticket = await spending.wait_for_room(live, config, messages, tools, output_schema,
                                              requested_at=requested_at)
        tokens = None
        try:
            reservation = await spending.reserve(live, at.path, config, messages, tools, output_schema)
            try:
                result = await call()
            except LLMError as exc:  # an HTTP error was refused before any work: not billed
                spending.settle(live, at.path, reservation, None, billed=exc.status is None)
                if exc.status is not None:
                    tokens = 0  # nor counted by the provider's limits
                raise
            except BaseException:  # lost, cut or cancelled: its reservation stays spent
                spending.settle(live, at.path, reservation, None, billed=True)
                raise
            spending.settle(live, at.path, reservation, result.usage, billed=True)
            if result.usage is not None:
                tokens = result.usage.prompt_tokens + result.usage.completion_tokens
            return result
        finally:
            await asyncio.shield(spending.gate.leave(ticket, tokens))

    async def client_for(self, config) -> Any:
        """The provider's client (`ProviderClients`: by provider, never by key), built in
        a thread the first time (importing a provider SDK takes ~1–4 s of CPU), holding no
        store connection meanwhile."""
        return await self.clients.get(config, before_build=self.store.release)

    def build_client(self, config) -> Any:
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

    async def close(self) -> None:
        """Close every provider client (best effort; one in use closes when its call ends)."""
        await self.clients.close()
