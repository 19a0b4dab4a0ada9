"""`/mcp`: orchestra as an MCP server (SPEC §14; web/mcp_server.py). Outside `/api/v1`:
it speaks MCP over streamable HTTP, not the JSON API, and MCP clients are configured
with this one URL."""

from __future__ import annotations

from sanic import Blueprint, Request

from orchestra.web.auth import protected

bp = Blueprint("mcp_endpoint")


@bp.route("/mcp", methods=["GET", "POST", "DELETE"], name="mcp_endpoint")
@protected(scope="run:start")
async def mcp_endpoint(request: Request) -> None:
    """Streamable HTTP: POST carries JSON-RPC messages, GET opens a handshake-era session's
    stream, DELETE ends that session. An access token or an API key with `run:start`."""
    await request.app.ctx.mcp.handle(request, request.ctx.principal)
