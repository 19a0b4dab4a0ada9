"""The tools a worker may use: the built-ins, then every MCP server's (SPEC §3, §9)."""

from __future__ import annotations

from typing import Any

from orchestra.services.shared import Shared


async def list_tools(core: Shared) -> list[dict[str, Any]]:
    """`[{name, description, parameters, source}]` of every tool a worker may use."""
    await core.tool_registry.load()
    return core.tool_registry.catalog()
