"""Client for OpenAI's chat-completions API and everything that imitates it.

One client serves the kinds `openai`, `deepseek`, `ollama` and `openai_compatible`;
only the base URL differs. It never retries: retrying is the engine's decision (see
`retry.py`), made only before any token is shown.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx

from orchestra.egress import PUBLIC_ONLY, EgressPolicy, find_refusal
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
from orchestra.tls import client_tls

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "deepseek": "https://api.deepseek.com/v1",
    "ollama": "http://127.0.0.1:11434/v1",
}
OPENAI_KINDS = ("openai", "deepseek", "ollama", "openai_compatible")

# Ollama and many local servers ignore the key; an Authorization header is sent all the same.
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


def _error_message(body: Any, text: str, status: int) -> str:
    """The provider's own error sentence: `error.message` of a JSON body, else the body's
    text, else the status."""
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message
    if text.strip():
        return text.strip()[:500]
    return f"Error code: {status}"


async def status_error(response: httpx.Response) -> LLMError:
    """An error answer (status >= 400) as an LLMError: retryable for 408, 429 and 5xx,
    with the provider's Retry-After."""
    status = response.status_code
    text = (await response.aread()).decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    retryable = status in (408, 429) or status >= 500
    retry_after = retry_after_from_headers(response.headers) if retryable else None
    return LLMError(_error_message(body, text, status), status=status, retryable=retryable,
                    retry_after=retry_after)


def transport_error(err: httpx.TransportError, *, streaming: bool = False) -> LLMError:
    """A timeout or a connection failure as a retryable LLMError. `streaming` says the
    answer had already begun, so a failure means the stream was cut, not never reached.
    A connection the egress rule refused is not retried: its message names the rule."""
    refused = find_refusal(err)
    if refused is not None:
        return LLMError(f"Could not reach the provider: {refused}", retryable=False)
    if isinstance(err, httpx.TimeoutException):
        what = "stopped sending" if streaming else "did not answer"
        return LLMError(f"The provider {what} in time (timeout).", retryable=True)
    detail = f": {err}" if str(err) else ""
    if streaming:
        return LLMError(f"The provider's stream was cut{detail}.", retryable=True)
    return LLMError(f"Could not reach the provider{detail}.", retryable=True)


def stream_error(error: Any) -> LLMError:
    """An `{"error": …}` object sent inside a stream: a failure on the provider's side,
    retryable unless the request itself was refused."""
    if not isinstance(error, dict):
        return LLMError(str(error) or "The provider reported an error.", retryable=True)
    message = error.get("message")
    return LLMError(message if isinstance(message, str) and message else json.dumps(error)[:500],
                    retryable=error.get("type") != "invalid_request_error")


async def sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The `data` of each server-sent event of a streamed answer, until `[DONE]`. The
    rest of the body is still read, so the connection goes back to the pool for the
    next call instead of being closed half-read."""
    data: list[str] = []
    done = False
    async for line in response.aiter_lines():
        if done:
            continue
        if not line:  # an event ends at a blank line
            if data:
                joined = "\n".join(data)
                data.clear()
                if joined == "[DONE]":
                    done = True
                    continue
                yield joined
            continue
        if line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
    if data and not done and "\n".join(data) != "[DONE]":
        yield "\n".join(data)


class _ToolCallBuffer:
    """Collects streamed tool-call fragments, keyed by their `index`."""

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, Any]] = {}

    def add(self, fragments: list[dict[str, Any]]) -> None:
        for position, frag in enumerate(fragments):
            index = frag.get("index")
            slot = self._parts.setdefault(position if index is None else index,
                                          {"id": "", "name": "", "arguments": []})
            if frag.get("id"):
                slot["id"] = frag["id"]
            fn = frag.get("function")
            if fn:
                if fn.get("name"):
                    slot["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["arguments"].append(fn["arguments"])

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


def read_usage(counts: dict[str, Any]) -> Usage:
    """A chunk's `usage`: cached prompt tokens from OpenAI's `prompt_tokens_details`, or
    DeepSeek's `prompt_cache_hit_tokens`."""
    details = counts.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") if isinstance(details, dict) else None) \
        or counts.get("prompt_cache_hit_tokens") or 0
    return Usage(prompt_tokens=int(counts.get("prompt_tokens") or 0),
                 completion_tokens=int(counts.get("completion_tokens") or 0),
                 cached_tokens=int(cached) if isinstance(cached, int | float) else 0)


class OpenAICompatClient:
    """`ChatClient` over the chat-completions API (OpenAI, DeepSeek, Ollama, compatibles),
    spoken with a plain HTTP stream (httpx2, the httpx successor the provider SDKs use:
    httpx's pool polls every idle keep-alive connection on each request). The openai SDK
    built a pydantic model per streamed chunk: 4.9 ms of CPU for a 40-token answer
    against about 1 ms here (docs/operations.md)."""

    def __init__(
        self,
        *,
        kind: str = "openai",
        api_key: str | None,
        base_url: str | None,
        timeout: float = 60.0,
        egress: EgressPolicy = PUBLIC_ONLY,
    ) -> None:
        if kind not in OPENAI_KINDS:
            raise LLMError(f"Unsupported provider kind for the OpenAI client: {kind!r}.")
        base_url = base_url or DEFAULT_BASE_URLS.get(kind)
        if not base_url:
            raise LLMError(f"A base_url is required for provider kind {kind!r}.")
        self.kind = kind
        self.base_url = base_url
        root = base_url.rstrip("/")
        self._chat_url = httpx.URL(root + "/chat/completions")  # InvalidURL for a bad host
        self._models_url = httpx.URL(root + "/models")
        self._client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {api_key or _PLACEHOLDER_KEY}"},
            timeout=timeout,
            # Every new connection obeys the egress rule (resolved once, pooled after).
            transport=egress.transport(
                verify=client_tls(),
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100)),
        )

    async def stream_chat(
        self, *, model: str, messages: list[ChatMessage], tools: list[ToolSpec],
        output_schema: dict[str, Any] | None = None, max_tokens: int | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one assistant turn; see `ChatClient` for the order of events."""
        params: dict[str, Any] = {
            "model": model,
            "messages": to_openai_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if max_tokens is not None:  # OpenAI's own API names it anew; others keep max_tokens
            params["max_completion_tokens" if self.kind == "openai" else "max_tokens"] = max_tokens
        if tools:
            params["tools"] = to_openai_tools(tools)
        if output_schema is not None:
            params.update(structured_params(self.kind, output_schema, params["messages"]))
        body = json.dumps(params, ensure_ascii=False, separators=(",", ":")).encode()
        request = self._client.build_request(
            "POST", self._chat_url, content=body, headers={"Content-Type": "application/json"})
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as err:
            raise transport_error(err) from err
        try:
            if response.status_code >= 400:
                raise await status_error(response)
            async for event in self._turn(response):
                yield event
        finally:
            await response.aclose()

    async def _turn(self, response: httpx.Response) -> AsyncIterator[StreamEvent]:
        text: list[str] = []
        buffer = _ToolCallBuffer()
        usage: Usage | None = None
        finish_reason: str | None = None
        try:
            async for data in sse_data(response):
                chunk = _chunk(data)
                if chunk is None:
                    continue
                counts = chunk.get("usage")
                if counts:
                    usage = read_usage(counts)
                for choice in chunk.get("choices") or ():
                    content = _take_delta(choice.get("delta"), buffer)
                    if content:
                        text.append(content)
                        yield TextDelta(content)
                    if choice.get("finish_reason"):
                        finish_reason = choice["finish_reason"]
        except httpx.TransportError as err:
            raise transport_error(err, streaming=True) from err

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
            response = await self._client.get(self._models_url)
        except httpx.TransportError as err:
            raise transport_error(err) from err
        if response.status_code >= 400:
            raise await status_error(response)
        try:
            listed = response.json().get("data") or []
            return [str(m["id"]) for m in listed]
        except (ValueError, AttributeError, TypeError, KeyError):
            raise LLMError("The provider's model list is not the JSON it should be.",
                           status=response.status_code) from None

    async def aclose(self) -> None:
        """Close the underlying HTTP connection pool."""
        await self._client.aclose()


def _chunk(data: str) -> dict[str, Any] | None:
    """One streamed chunk as a JSON object (None for any other JSON value); LLMError for
    text that is not JSON, or the provider's error sent in the stream."""
    try:
        chunk = json.loads(data)
    except ValueError:
        raise LLMError(f"The provider sent a chunk that is not JSON: {data[:200]}",
                       retryable=True) from None
    if not isinstance(chunk, dict):
        return None
    if "error" in chunk:
        raise stream_error(chunk["error"])
    return chunk


def _take_delta(delta: Any, buffer: _ToolCallBuffer) -> str | None:
    """A choice's delta: its tool call parts into `buffer`; its text, if any."""
    if not delta:
        return None
    if delta.get("tool_calls"):
        buffer.add(delta["tool_calls"])
    return delta.get("content") or None
