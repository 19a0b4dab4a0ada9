"""Talking to one MCP server with the official SDK: how to connect (streamable HTTP, or a
stdio process the operator allowed, with a minimal environment), list its tools, and
turn a call's result into what the model reads.

Nothing here touches the store. Every wait is bounded by the server's `timeout_seconds`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from orchestra.egress import PUBLIC_ONLY, EgressPolicy
from orchestra.engine.tools.base import ToolError
from orchestra.engine.tools.mcp.stdio import stdio_parameters

RESULT_MAX_CHARS = 200_000  # what one call may hand the model


@dataclass(frozen=True)
class McpServerConfig:
    """One server as the engine uses it: secrets decrypted, in memory only."""

    server_id: str
    name: str
    transport: str  # "streamable_http" | "stdio"
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = 30.0


_sdk_loaded = False


def _import_sdk() -> None:
    import httpx2  # noqa: F401
    from mcp import Client  # noqa: F401
    from mcp.client.stdio import StdioServerParameters  # noqa: F401
    from mcp.client.streamable_http import streamable_http_client  # noqa: F401


async def load_sdk() -> None:
    """Import the SDK in a thread the first time: it takes one to three seconds of CPU,
    which must not stall the event loop (and every request and run on it)."""
    global _sdk_loaded
    if not _sdk_loaded:
        await asyncio.to_thread(_import_sdk)
        _sdk_loaded = True


class McpServerError(ToolError):
    """The server could not be reached, timed out, or went away (shown to the model)."""


def _stdio_parameters(config: McpServerConfig, allowed: frozenset[str]) -> Any:
    """The SDK's spawn parameters, every stdio rule checked again (SPEC §9: at every
    start of the process); McpServerError naming what is refused."""
    try:
        return stdio_parameters(config, allowed)
    except ValueError as exc:
        raise McpServerError(f"The MCP server '{config.name}' was not started: {exc}") from None


@asynccontextmanager
async def connect(
    config: McpServerConfig, allowed: frozenset[str], egress: EgressPolicy = PUBLIC_ONLY,
) -> AsyncIterator[Any]:
    """An initialised `mcp.Client` for the server; the caller bounds the time it takes.
    Over HTTP every new connection obeys the egress rule (the SDK follows no redirect)."""
    from mcp import Client

    if config.transport == "stdio":
        from mcp.client.stdio import stdio_client

        from orchestra.observability.child_stderr import ChildStderr

        target: Any = _stdio_parameters(config, allowed)
        stderr = ChildStderr(f"mcp:{config.name}")  # its stderr as log lines, its last ones kept
        started = False
        try:
            async with Client(stdio_client(target, errlog=stderr.file), cache=None,
                              read_timeout_seconds=config.timeout_seconds) as client:
                started = True
                yield client
        except Exception as exc:
            if started:
                raise
            stderr.close(wait=1.0)  # it has exited: read what it said
            said = _redacted(stderr.tail(), config)
            if not said:
                raise
            raise McpServerError(
                f"The MCP server '{config.name}' could not be started ({failure_reason(exc)}); "
                f"its last words on stderr: {said}") from None
        finally:
            stderr.close()
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from orchestra.tls import client_tls

    timeout = httpx2.Timeout(config.timeout_seconds, read=max(config.timeout_seconds, 300.0))
    async with httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout,
                                  transport=egress.transport(verify=client_tls())) as http:
        transport = streamable_http_client(config.url or "", http_client=http)
        async with Client(transport, cache=None,
                          read_timeout_seconds=config.timeout_seconds) as client:
            yield client


def failure_reason(exc: BaseException) -> str:
    """One readable line for an SDK or transport failure (exception groups unwrapped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _redacted(text: str, config: McpServerConfig) -> str:
    """`text` without the server's own secrets (its env values), which a failing child
    may print: an error is shown to every signed-in user."""
    for value in config.env.values():
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


async def list_tools(client: Any) -> list[dict[str, Any]]:
    """Every tool the server lists (all pages): `[{name, description, parameters}]`."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(100):  # a server paging forever is cut off
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
            tools.append({
                "name": tool.name,
                "description": tool.description or tool.title or "",
                "parameters": schema or {"type": "object", "properties": {}},
            })
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def result_text(result: Any) -> str:
    """What the model reads: the text parts joined (other parts named by their type);
    structured content, as JSON, when the server sent no text. An error result raises
    ToolError with the server's message."""
    parts: list[str] = []
    for item in result.content or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource" and getattr(item.resource, "text", None) is not None:
            parts.append(item.resource.text)
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    text = "\n".join(parts)
    if result.is_error:
        raise ToolError(text or "The MCP tool reported an error.")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not any(getattr(i, "type", "") == "text" for i in result.content or []):
        text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"))
    if len(text) > RESULT_MAX_CHARS:
        text = text[:RESULT_MAX_CHARS] + "\n[cut: the result was longer]"
    return text
