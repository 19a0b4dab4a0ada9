"""Client for Anthropic's Messages API, behind the same `ChatClient` protocol.

Anthropic differs from chat completions in shape only: the system prompt is a separate
`system` field, tool calls are `tool_use` content blocks, and tool results go back as
`tool_result` blocks inside a user turn. The conversion functions are pure so they can
be tested without a network.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic

from orchestra.egress import PUBLIC_ONLY, EgressPolicy, find_refusal
from orchestra.engine.llm.base import (
    STRUCTURED_TOOL,
    ChatMessage,
    ChatResult,
    LLMError,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallsReady,
    ToolSpec,
    Usage,
)
from orchestra.engine.llm.openai_compat import parse_arguments
from orchestra.engine.llm.retry import retry_after_from_headers

DEFAULT_MAX_TOKENS = 4096

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}

# Error types Anthropic may send inside a stream that are worth another attempt.
_RETRYABLE_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Low-level HTTP errors the SDK lets escape while a stream is being read."""
    found: list[type[BaseException]] = []
    for module_name in ("httpx2", "httpx"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        found.append(module.TransportError)
    return tuple(found)


_TRANSPORT_ERRORS = _transport_errors()


def to_anthropic_system(messages: list[ChatMessage]) -> str | None:
    """All system messages joined into Anthropic's single `system` prompt."""
    parts = [m.content for m in messages if m.role == "system" and m.content]
    return "\n\n".join(parts) if parts else None


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id or "",
                "content": message.content or "",
            }
        ]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        )
    return blocks


def to_anthropic_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Convert the non-system turns to Anthropic `messages`.

    Tool results become `tool_result` blocks in a user turn; consecutive turns with the
    same role are merged, since the API expects user and assistant to alternate (and all
    results of one assistant turn in the single user turn that follows it).
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            blocks = [{"type": "text", "text": "(empty)"}]
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Convert tool specs to Anthropic `tools` entries."""
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


def map_anthropic_error(err: Exception, *, streaming: bool = False) -> LLMError:
    """Translate an SDK (or transport) exception to `LLMError` with the provider's message."""
    refused = find_refusal(err)
    if refused is not None:
        return LLMError(f"Could not reach the provider: {refused}", retryable=False)
    if isinstance(err, anthropic.APITimeoutError):
        return LLMError("The provider did not answer in time (timeout).", retryable=True)
    if isinstance(err, (anthropic.APIConnectionError, *_TRANSPORT_ERRORS)):
        if streaming:
            return LLMError(f"The provider's stream was cut: {err}", retryable=True)
        return LLMError(f"Could not reach the provider: {err}", retryable=True)
    if isinstance(err, anthropic.APIStatusError):
        message = err.api_message or (err.body if isinstance(err.body, str) else "") or err.message
        if err.status_code >= 400:
            status: int | None = err.status_code
            retryable = status in (408, 429) or status >= 500
        else:  # an `error` event inside a 200 stream
            status = None
            retryable = err.type in _RETRYABLE_TYPES
        retry_after = retry_after_from_headers(err.response.headers) if retryable else None
        return LLMError(
            str(message)[:500], status=status, retryable=retryable, retry_after=retry_after
        )
    return LLMError(str(err) or type(err).__name__)


def structured_params(schema: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A forced tool whose input is the structured answer (Anthropic has no response format)."""
    answer = {
        "name": STRUCTURED_TOOL,
        "description": "Give the final answer; its input is the answer itself.",
        "input_schema": schema if schema.get("type") == "object" else {
            "type": "object", "properties": {"value": schema}, "required": ["value"]},
    }
    choice = {"type": "any"} if tools else {"type": "tool", "name": STRUCTURED_TOOL}
    return {"tools": [*tools, answer], "tool_choice": choice}


class AnthropicClient:
    """`ChatClient` over Anthropic's streaming Messages API."""

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        http_client: Any = None,
        egress: EgressPolicy = PUBLIC_ONLY,
    ) -> None:
        """`http_client` (an SDK-compatible async HTTP client) replaces the SDK's own,
        e.g. to route through a test transport; without one, connections obey `egress`."""
        if not api_key:
            raise LLMError("An API key is required for Anthropic providers.")
        self.max_tokens = max_tokens
        if base_url:
            # The SDK adds `/v1/...` itself; accept URLs copied with the version included.
            base_url = base_url.rstrip("/").removesuffix("/v1")
        if http_client is None:
            import httpx2

            from orchestra.tls import client_tls

            http_client = httpx2.AsyncClient(
                timeout=timeout, follow_redirects=True,
                transport=egress.transport(verify=client_tls(), limits=httpx2.Limits(
                    max_connections=1000, max_keepalive_connections=100)))
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url or None,
            timeout=timeout,
            max_retries=0,
            http_client=http_client,
        )

    async def stream_chat(
        self, *, model: str, messages: list[ChatMessage], tools: list[ToolSpec],
        output_schema: dict[str, Any] | None = None, max_tokens: int | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one assistant turn; see `ChatClient` for the order of events.

        With `output_schema` the answer comes as a forced tool (`final_answer`, whose
        input schema is the output schema): the only tool when none other is offered,
        else `tool_choice: any` so the model may still use tools first. Its input becomes
        the turn's text (JSON), streamed as it arrives."""
        params: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens or self.max_tokens,
            "messages": to_anthropic_messages(messages),
            "stream": True,
        }
        system = to_anthropic_system(messages)
        if system:
            params["system"] = system
        if tools:
            params["tools"] = to_anthropic_tools(tools)
        if output_schema is not None:
            params.update(structured_params(output_schema, params.get("tools") or []))
        try:
            stream = await self._client.messages.create(**params)
        except (anthropic.AnthropicError, *_TRANSPORT_ERRORS) as err:
            raise map_anthropic_error(err) from err

        turn = _Turn(output_schema)
        try:
            async for event in stream:
                shown = turn.take(event)
                if shown:
                    yield TextDelta(shown)
        except (anthropic.AnthropicError, *_TRANSPORT_ERRORS) as err:
            raise map_anthropic_error(err, streaming=True) from err
        finally:
            await stream.close()
        for event in turn.end():
            yield event

    async def list_models(self) -> list[str]:
        """Model ids the key can use; proves that the key and URL work."""
        try:
            return [m.id async for m in self._client.models.list()]
        except (anthropic.AnthropicError, *_TRANSPORT_ERRORS) as err:
            raise map_anthropic_error(err) from err

    async def aclose(self) -> None:
        """Close the underlying HTTP connection pool."""
        await self._client.close()


class _Turn:
    """One streamed assistant turn as its events arrive: its text, its tool calls, the
    structured answer (the forced `final_answer` tool) and the usage."""

    def __init__(self, output_schema: dict[str, Any] | None) -> None:
        self.structured = output_schema is not None
        # a non-object answer travels as {"value": …}, shown once it is whole
        self.wrapped = output_schema is not None and output_schema.get("type") != "object"
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.stop_reason: str | None = None
        self.finished = False
        self.answer_index: int | None = None

    def take(self, event: Any) -> str | None:
        """Record one stream event; the text to show now, if any."""
        kind = event.type
        if kind == "message_start":
            u = event.message.usage
            self.prompt_tokens = ((u.input_tokens or 0) + (u.cache_creation_input_tokens or 0)
                                  + (u.cache_read_input_tokens or 0))
            self.cached_tokens = u.cache_read_input_tokens or 0
        elif kind == "content_block_start":
            return self._block(event)
        elif kind == "content_block_delta":
            return self._delta(event)
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            self.completion_tokens = event.usage.output_tokens or self.completion_tokens
        elif kind == "message_stop":
            self.finished = True
        return None

    def _block(self, event: Any) -> str | None:
        block = event.content_block
        if block.type == "tool_use" and self.structured and block.name == STRUCTURED_TOOL:
            self.answer_index = event.index
        elif block.type == "tool_use":
            self.calls[event.index] = {"id": block.id, "name": block.name, "json": []}
        elif block.type == "text" and block.text:
            self.text.append(block.text)
            return block.text
        return None

    def _delta(self, event: Any) -> str | None:
        delta = event.delta
        if delta.type == "text_delta" and delta.text:
            self.text.append(delta.text)
            return delta.text
        if delta.type == "input_json_delta" and event.index == self.answer_index:
            if delta.partial_json:  # the structured answer: shown as text
                self.text.append(delta.partial_json)
                if not self.wrapped:
                    return delta.partial_json
        elif delta.type == "input_json_delta" and event.index in self.calls:
            self.calls[event.index]["json"].append(delta.partial_json)
        return None

    def end(self) -> list[StreamEvent]:
        """The turn's closing events: tool calls, the wrapped answer, usage, the result.
        LLMError (retryable) when the stream was cut before the message ended."""
        if not self.finished:
            raise LLMError(
                "The provider's stream was cut before the reply was complete.", retryable=True
            )
        events: list[StreamEvent] = []
        tool_calls = [
            ToolCall(id=c["id"], name=c["name"], arguments=parse_arguments("".join(c["json"])))
            for _, c in sorted(self.calls.items())
        ]
        if tool_calls:
            events.append(ToolCallsReady(tool_calls))
        stop_reason, text = self.stop_reason, self.text
        if self.answer_index is not None and not tool_calls:
            stop_reason = "end_turn"  # the forced tool was the answer, not a call to run
            if self.wrapped:
                value = parse_arguments("".join(text)).get("value")
                text = [json.dumps(value, separators=(",", ":"))]
                events.append(TextDelta(text[0]))
        usage = Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                      cached_tokens=self.cached_tokens)
        events.append(usage)
        events.append(ChatResult(
            text="".join(text),
            tool_calls=tool_calls,
            usage=usage,
            finish_reason=FINISH_REASONS.get(stop_reason or "", stop_reason),
        ))
        return events
