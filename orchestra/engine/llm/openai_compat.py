"""Client for OpenAI's chat-completions API and everything that imitates it.

One `AsyncOpenAI` serves the kinds `openai`, `deepseek`, `ollama` and
`openai_compatible`; only the base URL differs. SDK retries are off (`max_retries=0`):
retrying is the engine's decision (see `retry.py`), made only before any token is shown.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai

from orchestra.engine.llm.base import (
    ChatMessage,
    ChatResult,
    LLMError,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallsReady,
    ToolSpec,
    Usage,
    schema_instructions,
)
from orchestra.engine.llm.retry import retry_after_from_headers

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "ollama": "http://127.0.0.1:11434/v1",
}
OPENAI_KINDS = ("openai", "deepseek", "ollama", "openai_compatible")

# Ollama and many local servers ignore the key, but the SDK insists on one.
_PLACEHOLDER_KEY = "not-needed"


def to_openai_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Convert our messages to chat-completions `messages` entries."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content or ""}
            )
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            entry: dict[str, Any] = {"role": m.role, "content": m.content or ""}
            if m.name and m.role == "user":
                entry["name"] = m.name
            out.append(entry)
    return out


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Convert tool specs to chat-completions `tools` entries."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def parse_arguments(raw: str) -> dict[str, Any]:
    """Parse a tool call's JSON arguments; anything but a JSON object becomes `{"_raw": raw}`."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


def _provider_message(err: openai.APIError) -> str:
    """The provider's own error sentence, falling back to the SDK's text."""
    body = err.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return err.message


def map_openai_error(err: openai.OpenAIError, *, streaming: bool = False) -> LLMError:
    """Translate an SDK exception to `LLMError`, keeping the provider's message.

    `streaming` says the response had already started, so a connection failure means
    the stream was cut rather than never reached.
    """
    if isinstance(err, openai.APITimeoutError):
        what = "stopped sending" if streaming else "did not answer"
        return LLMError(f"The provider {what} in time (timeout).", retryable=True)
    if isinstance(err, openai.APIConnectionError):
        cause = err.__cause__
        detail = f": {cause}" if cause and str(cause) else ""
        if streaming:
            return LLMError(f"The provider's stream was cut{detail}.", retryable=True)
        return LLMError(f"Could not reach the provider{detail}.", retryable=True)
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        retryable = status in (408, 429) or status >= 500
        retry_after = retry_after_from_headers(err.response.headers) if retryable else None
        return LLMError(
            _provider_message(err), status=status, retryable=retryable, retry_after=retry_after
        )
    if isinstance(err, openai.APIError):
        # An `{"error": …}` object sent inside a stream: a server-side failure.
        kind = err.body.get("type") if isinstance(err.body, dict) else None
        return LLMError(_provider_message(err), retryable=kind != "invalid_request_error")
    return LLMError(str(err) or type(err).__name__)


class _ToolCallBuffer:
    """Collects streamed tool-call fragments, keyed by their `index`."""

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, Any]] = {}

    def add(self, fragments: list[Any]) -> None:
        for position, frag in enumerate(fragments):
            index = frag.index if frag.index is not None else position
            slot = self._parts.setdefault(index, {"id": "", "name": "", "arguments": []})
            if frag.id:
                slot["id"] = frag.id
            fn = frag.function
            if fn is not None:
                if fn.name:
                    slot["name"] += fn.name
                if fn.arguments:
                    slot["arguments"].append(fn.arguments)

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(
                id=slot["id"] or f"call_{uuid.uuid4().hex[:24]}",
                name=slot["name"],
                arguments=parse_arguments("".join(slot["arguments"])),
            )
            for _, slot in sorted(self._parts.items())
        ]


def structured_params(kind: str, schema: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Request fields asking for JSON of `schema`: `response_format` json_schema (not
    strict: strict mode refuses many ordinary schemas); DeepSeek knows only json_object,
    so it gets that plus the schema as an instruction."""
    if kind == "deepseek":
        messages.insert(0, {"role": "system", "content": schema_instructions(schema)})
        return {"response_format": {"type": "json_object"}}
    return {"response_format": {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": False},
    }}


class OpenAICompatClient:
    """`ChatClient` over the chat-completions API (OpenAI, DeepSeek, Ollama, compatibles)."""

    def __init__(
        self,
        *,
        kind: str = "openai",
        api_key: str | None,
        base_url: str | None,
        timeout: float = 60.0,
    ) -> None:
        if kind not in OPENAI_KINDS:
            raise LLMError(f"Unsupported provider kind for the OpenAI client: {kind!r}.")
        base_url = base_url or DEFAULT_BASE_URLS.get(kind)
        if not base_url:
            raise LLMError(f"A base_url is required for provider kind {kind!r}.")
        self.kind = kind
        self.base_url = base_url
        self._client = openai.AsyncOpenAI(
            api_key=api_key or _PLACEHOLDER_KEY,
            base_url=base_url,
            timeout=timeout,
            max_retries=0,
        )

    async def stream_chat(
        self, *, model: str, messages: list[ChatMessage], tools: list[ToolSpec],
        output_schema: dict[str, Any] | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one assistant turn; see `ChatClient` for the order of events."""
        params: dict[str, Any] = {
            "model": model,
            "messages": to_openai_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            params["tools"] = to_openai_tools(tools)
        if output_schema is not None:
            params.update(structured_params(self.kind, output_schema, params["messages"]))
        try:
            stream = await self._client.chat.completions.create(**params)
        except openai.OpenAIError as err:
            raise map_openai_error(err) from err

        text: list[str] = []
        buffer = _ToolCallBuffer()
        usage: Usage | None = None
        finish_reason: str | None = None
        try:
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = Usage(
                        prompt_tokens=chunk.usage.prompt_tokens or 0,
                        completion_tokens=chunk.usage.completion_tokens or 0,
                    )
                for choice in chunk.choices or ():
                    delta = choice.delta
                    if delta is not None:
                        if delta.content:
                            text.append(delta.content)
                            yield TextDelta(delta.content)
                        if delta.tool_calls:
                            buffer.add(delta.tool_calls)
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
        except openai.OpenAIError as err:
            raise map_openai_error(err, streaming=True) from err
        finally:
            await stream.close()

        if finish_reason is None:
            raise LLMError(
                "The provider's stream was cut before the reply was complete.", retryable=True
            )
        calls = buffer.calls()
        if calls:
            yield ToolCallsReady(calls)
        if usage is not None:
            yield usage
        yield ChatResult(
            text="".join(text), tool_calls=calls, usage=usage, finish_reason=finish_reason
        )

    async def list_models(self) -> list[str]:
        """Model ids the provider offers; proves that the key and URL work."""
        try:
            return [m.id async for m in self._client.models.list()]
        except openai.OpenAIError as err:
            raise map_openai_error(err) from err

    async def aclose(self) -> None:
        """Close the underlying HTTP connection pool."""
        await self._client.close()
