"""LLM provider clients behind one streaming protocol (see `base.ChatClient`)."""

from orchestra.engine.llm.base import (
    ChatClient,
    ChatMessage,
    ChatResult,
    LLMError,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallsReady,
    ToolSpec,
    Usage,
    collect,
)
from orchestra.engine.llm.factory import SUPPORTED_KINDS, make_client
from orchestra.engine.llm.retry import with_retries

__all__ = [
    "SUPPORTED_KINDS",
    "ChatClient",
    "ChatMessage",
    "ChatResult",
    "LLMError",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolCallsReady",
    "ToolSpec",
    "Usage",
    "collect",
    "make_client",
    "with_retries",
]
