"""MCP servers as a tool source: their tools, as the last refresh listed them, named
`<server name>.<tool name>`, read from the store and kept until a change anywhere (a
cache hint) or `max_age` seconds. The catalog holds decrypted secrets in memory only.

Teams (SPEC §16): a workspace's servers' tools are that workspace's alone; the
instance-wide servers' are every workspace's. Looked up for a workspace, a name is its
own server's tool where it has a server of that name, else the instance-wide one's;
looked up for none (`workspace_id` None), only instance-wide tools are found."""

from __future__ import annotations

import json
import logging
from typing import Any

from orchestra import redaction
from orchestra.db.models import McpServer, utcnow
from orchestra.db.snapshot import StoreSnapshot
from orchestra.engine.tools.base import Tool, ToolContext, ToolError
from orchestra.engine.tools.mcp.client import McpServerConfig, McpServerError

logger = logging.getLogger("orchestra.mcp")


class McpTool(Tool):
    """One tool of one MCP server; runs through the calling run's session to it, and
    records how the server answered (its status is that of the last contact)."""

    def __init__(self, config: McpServerConfig, tool: dict[str, Any], catalog: McpCatalog | None = None) -> None:
        self.config = config
        self.catalog = catalog
        self.tool_name = str(tool["name"])
        self.name = f"{config.name}.{self.tool_name}"  # type: ignore[misc]
        self.description = str(tool.get("description") or "")  # type: ignore[misc]
        self.parameters = tool.get("parameters") or {"type": "object", "properties": {}}  # type: ignore[misc]
        self.source = {"mcp": config.server_id}  # type: ignore[misc]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if ctx.mcp is None:
            raise ToolError(f"The MCP tool {self.name} can only be called inside a run.")
        try:
            result = await ctx.mcp.call(self.config, self.tool_name, args)
        except McpServerError as exc:  # not reached, timed out, went away
            if self.catalog is not None:
                await self.catalog.contact(self.config.server_id, exc.message)
            raise
        if self.catalog is not None:
            await self.catalog.contact(self.config.server_id, None)
        return result


def server_config(row: McpServer, decrypt: Any) -> McpServerConfig:
    """The engine's view of a stored server; `decrypt` is the SecretBox's decrypt."""

    def secrets(ciphertext: str | None) -> dict[str, str]:
        opened = json.loads(decrypt(ciphertext)) if ciphertext else {}
        redaction.remember_credentials(opened.values())  # SPEC §15b: never in a log line or event
        return opened

    return McpServerConfig(
        server_id=row.id,
        name=row.name,
        transport=row.transport,
        url=row.url,
        headers=secrets(row.headers_encrypted),
        command=row.command,
        args=tuple(row.args or ()),
        env=secrets(row.env_encrypted),
        timeout_seconds=float(row.timeout_seconds),
    )


#: Tools by workspace (None: the instance-wide servers'), then by catalog name.
Tools = dict[str | None, dict[str, McpTool]]


class McpCatalog:
    """The MCP tools of every server, by workspace and catalog name (a `ToolSource`)."""

    def __init__(self, db: Any, decrypt: Any, *, max_age: float = 30.0) -> None:
        self._db = db
        self._decrypt = decrypt
        self.snapshot: StoreSnapshot[Tools] = StoreSnapshot(self._read, {}, max_age=max_age)
        self._status: dict[str, str | None] = {}  # server id -> last_error, as last read or written

    def invalidate(self) -> None:
        self.snapshot.invalidate()

    def _for(self, workspace_id: str | None) -> dict[str, McpTool]:
        """What a worker of `workspace_id` sees: the instance-wide tools, where the
        workspace has a server of the same name its server's tools instead."""
        value = self.snapshot.value
        wide = value.get(None, {})
        own = value.get(workspace_id, {}) if workspace_id is not None else {}
        if not own:
            return wide
        shadowed = {tool.config.name.casefold() for tool in own.values()}
        seen = {name: tool for name, tool in wide.items() if tool.config.name.casefold() not in shadowed}
        return {**seen, **own}

    def tools(self, workspace_id: str | None = None) -> list[Tool]:
        return list(self._for(workspace_id).values())

    def get(self, name: str, workspace_id: str | None = None) -> Tool | None:
        return self._for(workspace_id).get(name)

    async def load(self) -> None:
        await self.snapshot.current()

    async def contact(self, server_id: str, error: str | None) -> None:
        """Store the outcome of a contact with a server (a tool call at run time), as a
        refresh does: `last_error` set, or cleared once it answers again. Nothing is sent to
        the store while the status read with the catalog is unchanged (a call that answers,
        as the last did, costs no round trip; a change anywhere drops the catalog through
        its cache hint), and the row is written only when it differs; a store that is away
        does not fail the call."""
        if server_id in self._status and self._status[server_id] == error:
            return
        changed = McpServer.last_error.is_null(False) if error is None else (
            McpServer.last_error.is_null() | (McpServer.last_error != error))
        try:
            await self._db.aexecute(McpServer.update({McpServer.last_error: error, McpServer.refreshed_at: utcnow()})
                                    .where((McpServer.id == server_id) & changed))
        except Exception as exc:  # noqa: BLE001 - the status is a hint; the call's outcome stands
            logger.warning("MCP server %s: its status could not be stored: %r", server_id, exc)
            return
        self._status[server_id] = error

    async def _read(self) -> Tools:
        rows = await self._db.list(McpServer.select().order_by(McpServer.name_key))
        self._status = {row.id: row.last_error for row in rows}
        tools: Tools = {}
        for row in rows:
            try:
                config = server_config(row, self._decrypt)
            except ValueError:
                logger.warning("secrets of MCP server %s cannot be decrypted", row.name)
                continue
            for tool in row.tools or []:
                item = McpTool(config, tool, self)
                tools.setdefault(row.workspace_id, {})[item.name] = item
        return tools
