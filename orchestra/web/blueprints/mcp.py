"""`/api/v1/resource/mcp`: MCP servers whose tools join the catalog (SPEC §9).
Administrators change them; everyone signed in reads them."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.engine.tools.mcp.stdio import COMMAND_PATTERN, ENV_NAME_PATTERN
from orchestra.services import mcp as mcp_service
from orchestra.services.charset import SPACE_RANGES, char_class
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import URL_PATTERN, rule
from orchestra.web.auth import protected
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("mcp", url_prefix="/resource/mcp")

_SECRET_VALUES = (
    "Values are secrets: encrypted at rest, shown as …abcd. On PUT, a value sent back "
    "as shown keeps the stored one."
)


_SPACE = char_class(SPACE_RANGES)
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}/")
# A secret value: a masked one (…abcd) is only a stored value sent back on PUT.
_UNMASKED = "^(?!\u2026)"
_HEADER_VALUE = rf"{_UNMASKED}[\t -~]{{0,{mcp_service.SECRET_MAX}}}$"
_ENV_VALUE = rf"{_UNMASKED}[^\u0000]{{0,{mcp_service.SECRET_MAX}}}$"


def _transport_rules() -> dict:
    """What each transport requires and refuses: a streamable_http server has a `url` and
    no command, args or env; a stdio server a `command` and no url or headers (an empty
    value counts as none)."""
    return {
        "if": {"properties": {"transport": {"const": "stdio"}}},
        "then": {
            "required": ["command"],
            "properties": {
                "command": {"type": "string", "pattern": r"\S"},
                "url": {"maxLength": 0}, "headers": {"maxProperties": 0},
            },
        },
        "else": {
            "required": ["url"],
            "properties": {
                "url": {"type": "string", "pattern": URL_PATTERN},
                "command": {"maxLength": 0}, "args": {"maxItems": 0}, "env": {"maxProperties": 0},
            },
        },
    }


class McpServerBody(Body):
    """A server; `url` (and `headers`) for streamable_http, `command` (`args`, `env`) for
    stdio, a bare command name ORCHESTRA_MCP_STDIO_COMMANDS must list (else 422). A `url`
    the egress rule refuses is 422 (ORCHESTRA_EGRESS_ALLOW). On PUT a masked value keeps
    its secret only while `url` / `command` is unchanged."""

    model_config = Body.model_config | {"json_schema_extra": _transport_rules()}

    @staticmethod
    def settings_schema(schema: dict, settings) -> None:
        """The stdio commands this server allows (ORCHESTRA_MCP_STDIO_COMMANDS), exactly;
        with none, the stdio transport is not offered at all."""
        allowed = sorted(settings.mcp_stdio_allowed)
        if not allowed:
            schema["properties"]["transport"]["enum"] = ["streamable_http"]
            schema["properties"]["transport"]["description"] += (
                " stdio is off: ORCHESTRA_MCP_STDIO_COMMANDS lists no command.")
            return
        names = "|".join("".join("\\" + c if c in _REGEX_SPECIAL else c for c in name) for name in allowed)
        schema["then"]["properties"]["command"] = {
            "type": "string", "pattern": f"^[{_SPACE}]*(?:{names})[{_SPACE}]*$",
            "description": "One of ORCHESTRA_MCP_STDIO_COMMANDS: " + ", ".join(allowed) + ".",
        }

    name: str = rule(
        description="1-64 letters, digits, '_' or '-'; prefixes its tools' names.",
        pattern=r"^\s*[A-Za-z0-9_-]{1,64}\s*$",
    )
    transport: str = rule(enum=list(mcp_service.TRANSPORTS), description="How to reach the server.")
    url: str | None = rule(
        None, description="streamable_http: the server's MCP endpoint, http(s)://host[:port][/path].",
        maxLength=mcp_service.URL_MAX,
    )
    headers: dict[str, str] | None = rule(
        None, description=f"streamable_http: HTTP headers sent with every request (printable "
        f"ASCII values). {_SECRET_VALUES}",
        maxProperties=mcp_service.SECRETS_MAX,
        propertyNames={"pattern": mcp_service.HEADER_NAME.pattern},
        additionalProperties={"type": "string", "pattern": _HEADER_VALUE},
    )
    command: str | None = rule(
        None, description="stdio: a bare command name (no path), listed in ORCHESTRA_MCP_STDIO_COMMANDS "
        "and looked up on the server's own PATH.",
        maxLength=mcp_service.COMMAND_MAX, pattern=COMMAND_PATTERN,
    )
    args: list[str] | None = rule(None, description="stdio: its arguments.", maxItems=mcp_service.ARGS_MAX)
    env: dict[str, str] | None = rule(
        None, description="stdio: its environment, besides the server's PATH and HOME; names "
        f"no runtime or library interprets (docs/api.md, the env rule). {_SECRET_VALUES}",
        maxProperties=mcp_service.SECRETS_MAX, propertyNames={"pattern": ENV_NAME_PATTERN},
        additionalProperties={"type": "string", "pattern": _ENV_VALUE},
    )
    timeout_seconds: float | None = rule(
        None, description="Bound on connecting and on each call, seconds (default 30).",
        exclusiveMinimum=0, maximum=mcp_service.TIMEOUT_MAX,
    )


def _fields(body: McpServerBody) -> dict:
    return {
        "name": body.name, "transport": body.transport, "url": body.url, "headers": body.headers,
        "command": body.command, "args": body.args, "env": body.env,
        "timeout_seconds": body.timeout_seconds,
    }


def _answer(server, status: int = 200):
    return json({"message": SUCCESS, "server_id": server.id, "server": mcp_service.server_view(server)},
                status=status)


@bp.post("", strict_slashes=False)
@documented(
    "Register an MCP server (connects and lists its tools)", body=McpServerBody,
    response=out.McpServer, status=201,
    errors={409: "ConflictError: the name is taken (ignoring case)."},
    links={
        "Read": Link("mcp.read", {"server_id": "$response.body#/server_id"}),
        "Replace": Link("mcp.update", {"server_id": "$response.body#/server_id"}),
        "Refresh": Link("mcp.refresh", {"server_id": "$response.body#/server_id"}),
        "Delete": Link("mcp.delete", {"server_id": "$response.body#/server_id"}),
    },
)
@protected(Role.ADMINISTRATOR)
async def create(request: Request):
    body = parse_body(request, McpServerBody)
    server = await mcp_service.create_server(
        request.app.ctx.core, **_fields(body), created_by=request.ctx.principal.user_id
    )
    return _answer(server, 201)


@bp.get("", strict_slashes=False)
@documented("List the MCP servers, by name", response=out.McpServerList)
@protected(Role.USER)
async def list_all(request: Request):
    rows = await mcp_service.list_servers(request.app.ctx.core)
    return json({"message": SUCCESS, "servers": [mcp_service.server_view(s) for s in rows]})


@bp.get("/<server_id:str>")
@documented("Read an MCP server, its tools and its last error", response=out.McpServer)
@protected(Role.USER)
async def read(request: Request, server_id: str):
    return _answer(await mcp_service.get_server(request.app.ctx.core, server_id))


@bp.put("/<server_id:str>")
@documented(
    "Replace an MCP server (every field; connects and lists its tools again)",
    body=McpServerBody, response=out.McpServer,
    errors={409: "ConflictError: the name is taken (ignoring case)."},
)
@protected(Role.ADMINISTRATOR)
async def update(request: Request, server_id: str):
    body = parse_body(request, McpServerBody)
    server = await mcp_service.update_server(request.app.ctx.core, server_id=server_id, **_fields(body))
    return _answer(server)


@bp.delete("/<server_id:str>")
@documented(
    "Delete an MCP server", response=out.Done,
    errors={409: "ConflictError: workers use its tools (detail names them)."},
)
@protected(Role.ADMINISTRATOR)
async def delete(request: Request, server_id: str):
    await mcp_service.delete_server(request.app.ctx.core, server_id=server_id)
    return json({"message": SUCCESS})


@bp.post("/<server_id:str>/refresh")
@documented("Connect and list the server's tools again (the outcome is kept)", response=out.McpServer)
@protected(Role.ADMINISTRATOR)
async def refresh(request: Request, server_id: str):
    return _answer(await mcp_service.refresh_server(request.app.ctx.core, server_id=server_id))
