"""`/mcp`'s place in the process: the MCP server (web/mcp_server.py) is built on the first
`/mcp` request, not at start.

The official SDK's server side costs ~1.6 s of CPU to import, nearly half of what the
whole server costs to start, and most processes never serve `/mcp`. The first request
imports it in a thread (the event loop, and every request and run on it, go on), builds
and starts the endpoint once however many requests arrive together, and hands them all
to it; later requests go straight through.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from sanic import Request

from orchestra.web.auth import Principal


class McpHost:
    """Builds this process's `McpEndpoint` when first needed and stops it with the process."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.endpoint: Any = None  # web.mcp_server.McpEndpoint, once a request needed it
        self._building = asyncio.Lock()

    async def handle(self, request: Request, principal: Principal, *, opening: bool = False) -> None:
        """Serve one `/mcp` request (authenticated by the route; `opening`: an `initialize`)."""
        endpoint = self.endpoint or await self._build()
        await endpoint.handle(request, principal, opening=opening)

    async def _build(self) -> Any:
        async with self._building:
            if self.endpoint is None:
                module = await asyncio.to_thread(importlib.import_module, "orchestra.web.mcp_server")
                endpoint = module.McpEndpoint(self.core)
                await endpoint.start()
                self.endpoint = endpoint
            return self.endpoint

    async def stop(self) -> None:
        async with self._building:
            if self.endpoint is not None:
                await self.endpoint.stop()
