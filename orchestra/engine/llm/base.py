"""Provider-neutral chat types and the `ChatClient` protocol every provider client follows.

The engine speaks only these types; each provider module converts them to and from its
SDK, so adding a provider never touches the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(slots=True)
class ToolCall:
    """A tool invocation requested by the model; `arguments` is the parsed JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class ChatMessage:
    """One turn of a conversation.

    `tool_calls` is set on assistant turns that asked for tools; `tool_call_id` (and
    optionally `name`, the tool's name) on the `tool` turn that answers one of them.
    """

    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model: `parameters` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class TextDelta:
    """A piece of streamed assistant text, yielded as soon as it arrives."""

    text: str


@dataclass(slots=True)
class ToolCallsReady:
    """All tool calls of the turn, complete and parsed (yielded once, after the text)."""

    calls: list[ToolCall]


@dataclass(slots=True)
class Usage:
    """Token counts reported by the provider for the whole turn; `cached_tokens` are the
    part of the prompt read from the provider's cache (priced apart, SPEC §12)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(slots=True)
class ChatResult:
    """The whole turn; always the last event of a successful stream."""

    text: str
    tool_calls: list[ToolCall]
    usage: Usage | None
    finish_reason: str | None


StreamEvent = TextDelta | ToolCallsReady | Usage | ChatResult


class LLMError(Exception):
    """A provider call failed.

    `message` is the provider's own wording where it gave one (e.g. OpenAI's
    `error.message`), so it can be shown to the user as is. `retryable` says whether
    trying again may help (429, 5xx, timeouts, dropped connections); `retry_after` is
    the provider's requested wait in seconds, when it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.shown = False  # part of the answer was already shown (never tried again)

    def __repr__(self) -> str:
        return (
            f"LLMError({self.message!r}, status={self.status!r}, "
            f"retryable={self.retryable!r}, retry_after={self.retry_after!r})"
        )


@runtime_checkable
class ChatClient(Protocol):
    """What the engine needs from a provider.

    `stream_chat` yields `TextDelta`s as tokens arrive, then `ToolCallsReady` if the
    model asked for tools, then `Usage` if the provider reported it, and finally one
    `ChatResult` summing up the turn. Failures raise `LLMError`, possibly after some
    deltas were already yielded (a stream cut mid-way).

    `max_tokens` caps the answer's tokens (what a budget reserves for it, SPEC §12).
    `output_schema` asks for a final answer that is JSON of that shape, the provider's
    own way where it has one (OpenAI-compatible `response_format`, an Anthropic forced
    tool), else by instructions; the answer's text is then that JSON. The caller still
    parses and validates it (providers do not all enforce the schema).
    """

    def stream_chat(
        self, *, model: str, messages: list[ChatMessage], tools: list[ToolSpec],
        output_schema: dict[str, Any] | None = None, max_tokens: int | None = None,
    ) -> AsyncIterator[StreamEvent]: ...

    async def list_models(self) -> list[str]: ...

    async def aclose(self) -> None: ...


async def collect(stream: AsyncIterator[StreamEvent]) -> ChatResult:
    """Drain a `stream_chat` stream and return its `ChatResult` (handy in tests and CLIs)."""
    result: ChatResult | None = None
    async for event in stream:
        if isinstance(event, ChatResult):
            result = event
    if result is None:
        raise LLMError("The provider's stream ended without a result.", retryable=True)
    return result


STRUCTURED_TOOL = "final_answer"  # the forced tool carrying a structured answer (Anthropic)


def schema_instructions(schema: Any) -> str:
    """The plain instruction for a provider with no structured-output mode of its own."""
    import json

    return (
        "Answer with one JSON value and nothing else (no prose, no code fence) that "
        "validates against this JSON Schema:\n" + json.dumps(schema, separators=(",", ":"))
    )
