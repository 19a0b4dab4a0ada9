"""`/mcp`: orchestra as an MCP server (SPEC §14; web/mcp_server.py). Outside `/api/v1`:
it speaks MCP over streamable HTTP, not the JSON API, and MCP clients are configured
with this one URL.

A POST body is held to the JSON API's strict JSON (orchestra/json_body.py) before the SDK
reads it (SPEC §15b): `NaN`, `Infinity`, a key twice in one object, bytes that are not
UTF-8, nesting past 64 levels … are 400 with a JSON-RPC parse error (-32700, `id`
null), as the JSON-RPC spec says of text that does not parse."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra import json_body
from orchestra.web.auth import protected

bp = Blueprint("mcp_endpoint")
PARSE_ERROR = -32700


@bp.route("/mcp", methods=["GET", "POST", "DELETE"], name="mcp_endpoint")
@protected(scope="run:start")
async def mcp_endpoint(request: Request):
    """Streamable HTTP: POST carries JSON-RPC messages, GET opens a handshake-era session's
    stream, DELETE ends that session. An access token or an API key with `run:start`."""
    opening = False
    if request.method == "POST" and (request.body or b"").strip():
        try:
            message = json_body.parse(request.body)
        except json_body.JSONBodyError as exc:
            return json({"jsonrpc": "2.0", "id": None,
                         "error": {"code": PARSE_ERROR, "message": f"Parse error: {exc}"}}, status=400)
        opening = isinstance(message, dict) and message.get("method") == "initialize"
    await request.app.ctx.mcp.handle(request, request.ctx.principal, opening=opening)
    return None
