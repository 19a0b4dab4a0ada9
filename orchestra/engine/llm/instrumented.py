"""Metrics and spans around the engine's model streams (`orchestra_llm_*`, `llm <kind>`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from orchestra.engine.llm.base import ChatResult
from orchestra.observability import metrics, tracing


class InstrumentedChatClient:
    """A provider client whose `stream_chat` is counted (`orchestra_llm_calls_total`,
    its duration, the tokens reported) and traced (`llm <kind>`); everything else is the
    wrapped client's."""

    def __init__(self, client: Any, provider: str) -> None:
        self._client = client
        self._provider = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def stream_chat(self, *, model: str, messages, tools, **options: Any) -> AsyncIterator[Any]:
        started = time.perf_counter()
        span = tracing.start_span(f"llm {self._provider}", {
            "gen_ai.system": self._provider, "gen_ai.request.model": model})
        outcome, error = "ok", None
        try:
            async for event in self._client.stream_chat(
                    model=model, messages=messages, tools=tools, **options):
                if isinstance(event, ChatResult) and event.usage is not None:
                    metrics.llm_tokens(self._provider, prompt=event.usage.prompt_tokens,
                                       completion=event.usage.completion_tokens)
                    span.set_attribute("gen_ai.usage.input_tokens", event.usage.prompt_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", event.usage.completion_tokens)
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        except BaseException as exc:
            outcome, error = "error", getattr(exc, "message", None) or type(exc).__name__
            raise
        finally:
            metrics.llm_call(self._provider, outcome, time.perf_counter() - started)
            span.set_attribute("orchestra.outcome", outcome)
            span.end(error)


def instrument_client(client: Any, provider: str) -> Any:
    return InstrumentedChatClient(client, provider)
