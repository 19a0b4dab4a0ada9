"""Build the right `ChatClient` for a registered provider's kind."""

from __future__ import annotations

from orchestra.egress import PUBLIC_ONLY, EgressPolicy
from orchestra.engine.llm.base import ChatClient, LLMError

SUPPORTED_KINDS = ("openai", "deepseek", "anthropic", "ollama", "openai_compatible")


def make_client(
    *, kind: str, api_key: str | None, base_url: str | None, timeout: float = 60.0,
    egress: EgressPolicy = PUBLIC_ONLY,
) -> ChatClient:
    """A client for `kind`; `base_url` overrides the kind's default endpoint. Its
    connections obey `egress` (the default: public addresses only).

    Raises `LLMError` (not retryable) for an unknown kind, an `openai_compatible`
    provider without `base_url`, or an `anthropic` provider without a key, so the
    caller can show the reason like any other provider failure.
    """
    if kind == "anthropic":
        from orchestra.engine.llm.anthropic import AnthropicClient

        return AnthropicClient(api_key=api_key, base_url=base_url, timeout=timeout, egress=egress)
    if kind in SUPPORTED_KINDS:
        from orchestra.engine.llm.openai_compat import OpenAICompatClient

        return OpenAICompatClient(kind=kind, api_key=api_key, base_url=base_url, timeout=timeout,
                                  egress=egress)
    raise LLMError(
        f"Unsupported provider kind {kind!r}; supported kinds: {', '.join(SUPPORTED_KINDS)}."
    )


def preload() -> None:
    """Import the OpenAI-compatible client now. Done by `orchestra serve` before it
    listens: a large import on first use, even in a thread, holds the interpreter long
    enough to stall every request for a moment (the Anthropic SDK, used by one kind
    only, still loads on first use, in a thread)."""
    import orchestra.engine.llm.openai_compat  # noqa: F401
