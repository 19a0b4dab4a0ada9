"""The tools a worker may use: the built-ins, then the MCP servers' (SPEC §3, §9): the
instance-wide ones, and a workspace's own for a worker of that workspace (SPEC §16)."""

from __future__ import annotations

from typing import Any

from orchestra.services.shared import Shared


async def list_tools(core: Shared, workspace_id: str | None = None) -> list[dict[str, Any]]:
    """`[{name, description, parameters, source}]` of every tool a worker of
    `workspace_id` may use (None: the built-ins and the instance-wide servers' tools)."""
    await core.tool_registry.load()
    return core.tool_registry.catalog(workspace_id)
