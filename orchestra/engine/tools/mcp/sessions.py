"""MCP sessions of a run: one per server, opened at the run's first call to that server,
closed when the run ends (finished, failed, cancelled or handed back). A run resumed
elsewhere starts with no sessions and opens its own.

Each session lives in a task of its own: the SDK's transports are anyio task groups,
which must be left by the task that entered them, while a run calls tools from its
step tasks and closes from its own. Calls go through the open client from any task.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from orchestra.egress import PUBLIC_ONLY, EgressPolicy, find_refusal
from orchestra.engine.tools.base import ToolError
from orchestra.engine.tools.mcp.client import (
    McpServerConfig,
    McpServerError,
    connect,
    failure_reason,
    list_tools,
    load_sdk,
    result_text,
)

logger = logging.getLogger("orchestra.mcp")

CLOSE_SECONDS = 5.0  # how long closing one session may take (a stdio server gets 2 s + kill)


class McpSession:
    """One open client to one server, held by its own task until `close()`."""

    def __init__(
        self, config: McpServerConfig, allowed: frozenset[str], egress: EgressPolicy = PUBLIC_ONLY,
    ) -> None:
        self.config = config
        self._allowed = allowed
        self._egress = egress
        self._client: Any = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        return self._client is not None and self._task is not None and not self._task.done()

    async def open(self) -> None:
        """Connect and initialise within the server's timeout; McpServerError otherwise."""
        await load_sdk()  # off the event loop, before the timeout starts
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(
            self._hold(ready), name=f"mcp-{self.config.name}"
        )
        try:
            async with asyncio.timeout(self.config.timeout_seconds):
                await asyncio.shield(ready)
        except TimeoutError:
            await self.close()
            raise McpServerError(
                f"The MCP server '{self.config.name}' did not answer within "
                f"{self.config.timeout_seconds:g} s."
            ) from None
        except asyncio.CancelledError:
            await self.close()
            raise

    async def _hold(self, ready: asyncio.Future) -> None:
        try:
            async with connect(self.config, self._allowed, self._egress) as client:
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits on `ready`
            if not ready.done():
                ready.set_exception(_unreachable(self.config, exc))
            else:
                logger.info("MCP server %s went away: %s", self.config.name, failure_reason(exc))
        finally:
            self._client = None

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        """One tool call bounded by the server's timeout; every failure is a ToolError."""
        client = self._client
        if client is None or not self.alive:
            raise McpServerError(f"The MCP server '{self.config.name}' is not connected.")
        limit = self.config.timeout_seconds
        watch = asyncio.ensure_future(client.call_tool(tool, arguments))
        try:
            async with asyncio.timeout(limit):
                done, _ = await asyncio.wait({watch, self._task}, return_when=asyncio.FIRST_COMPLETED)
            if watch not in done:  # the session ended under the call: the server is gone
                raise McpServerError(f"The MCP server '{self.config.name}' went away during the call.")
            result = watch.result()
        except TimeoutError:
            raise McpServerError(
                f"The MCP tool '{self.config.name}.{tool}' did not answer within {limit:g} s "
                "(the server's timeout_seconds)."
            ) from None
        except ToolError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the protocol or transport failed
            raise McpServerError(
                f"The MCP server '{self.config.name}' failed the call: {failure_reason(exc)}"
            ) from None
        finally:
            if not watch.done():  # timed out, cancelled, or the server went away
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
        return result_text(result)

    async def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools, bounded by its timeout."""
        if self._client is None:
            raise McpServerError(f"The MCP server '{self.config.name}' is not connected.")
        async with asyncio.timeout(self.config.timeout_seconds):
            return await list_tools(self._client)

    async def close(self) -> None:
        """End the session (bounded); a session that will not end is cancelled."""
        task = self._task
        if task is None:
            return
        self._stop.set()
        try:
            async with asyncio.timeout(CLOSE_SECONDS):
                await asyncio.gather(asyncio.shield(task), return_exceptions=True)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class RunSessions:
    """The MCP sessions of one run: `call()` opens a server's session at its first use;
    `aclose()` (the run's end) closes them all. `opened` counts sessions opened."""

    def __init__(self, allowed: frozenset[str], egress: EgressPolicy = PUBLIC_ONLY) -> None:
        self._allowed = allowed
        self._egress = egress
        self._sessions: dict[str, McpSession] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.opened = 0
        self.closed = False

    async def call(self, config: McpServerConfig, tool: str, arguments: dict[str, Any]) -> str:
        session = await self._session(config)
        return await session.call(tool, arguments)

    async def _session(self, config: McpServerConfig) -> McpSession:
        if self.closed:
            raise McpServerError("The run has ended; no MCP session is opened for it.")
        lock = self._locks.setdefault(config.server_id, asyncio.Lock())
        async with lock:
            session = self._sessions.get(config.server_id)
            if session is not None and session.alive and session.config == config:
                return session
            if session is not None:  # lost, or the server was changed: start again
                self._sessions.pop(config.server_id, None)
                await session.close()
            session = McpSession(config, self._allowed, self._egress)
            self.opened += 1
            await session.open()
            self._sessions[config.server_id] = session
            return session

    async def aclose(self) -> None:
        """Close every session of the run, concurrently."""
        self.closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        if sessions:
            await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def _unreachable(config: McpServerConfig, exc: BaseException) -> ToolError:
    if isinstance(exc, ToolError):
        return exc
    refused = find_refusal(exc)
    if refused is not None:
        return McpServerError(f"The MCP server '{config.name}' was not called: {refused}")
    return McpServerError(f"The MCP server '{config.name}' could not be reached: {failure_reason(exc)}")

