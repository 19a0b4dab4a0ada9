"""`/api/v1/resource/mcp`: MCP servers whose tools join the catalog (SPEC §9).
Instance-wide ones: administrators change them, everyone signed in reads them. A
workspace's own (`workspace_id` in the body, `?workspace_id=` on the other routes; SPEC
§16): its admins change them, its members read them."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.engine.tools.mcp.stdio import COMMAND_PATTERN, ENV_NAME_PATTERN
from orchestra.services import mcp as mcp_service
from orchestra.services.charset import SPACE_RANGES, char_class
from orchestra.services.roles import Role
from orchestra.services.workspace_rights import Action
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented, query
from orchestra.web.apidoc.rules import ID_PATTERN, URL_PATTERN, id_rule, rule
from orchestra.web.apidoc.workspace_shapes import BLANK_WORKSPACE, NOT_A_MEMBER
from orchestra.web.auth import protected
from orchestra.web.paging import workspace_arg
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


class McpServerCreateBody(McpServerBody):
    __doc__ = McpServerBody.__doc__
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need admin there; "
                                       "404 when you are not a member; its tools are that workspace's "
                                       "workers' only); default: instance-wide (ADMINISTRATOR+).")


_WORKSPACE = query("workspace_id", "The workspace's servers (you need admin there to change them, any role "
                   "to read them; 404 when you are not a member); default: the instance-wide ones "
                   "(ADMINISTRATOR+ to change them).", type="string", pattern=ID_PATTERN)
_ERRORS = {403: "PermissionDeniedError: instance-wide servers need ADMINISTRATOR+ to change, a workspace's "
                "need admin there.", 404: NOT_A_MEMBER}
_READ_ERRORS = {404: NOT_A_MEMBER, 422: BLANK_WORKSPACE}  # ?workspace_id=
_QUERY_ERRORS = {**_ERRORS, 422: BLANK_WORKSPACE}  # routes without a body


async def _scope(request: Request, action: Action = Action.MANAGE) -> str | None:
    return await mcp_service.scope_of(request.app.ctx.core, request.ctx.principal, workspace_arg(request), action)


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
    "Register an MCP server (connects and lists its tools)", body=McpServerCreateBody,
    response=out.McpServer, status=201,
    errors={409: "ConflictError: the name is taken (ignoring case) in that workspace, or among the "
                 "instance-wide servers.", **_ERRORS},
    links={
        "Read": Link("mcp.read", {"server_id": "$response.body#/server_id"}),
        "Replace": Link("mcp.update", {"server_id": "$response.body#/server_id"}),
        "Refresh": Link("mcp.refresh", {"server_id": "$response.body#/server_id"}),
        "Delete": Link("mcp.delete", {"server_id": "$response.body#/server_id"}),
    },
)
@protected(Role.USER)
async def create(request: Request):
    core, principal = request.app.ctx.core, request.ctx.principal
    raw = request.json if isinstance(request.json, dict) else {}
    if raw.get("workspace_id") is None:  # instance-wide: the role first, as before workspaces
        await mcp_service.scope_of(core, principal, None)
    body = parse_body(request, McpServerCreateBody)
    workspace_id = await mcp_service.scope_of(core, principal, body.workspace_id)
    server = await mcp_service.create_server(
        core, **_fields(body), created_by=principal.user_id, workspace_id=workspace_id
    )
    return _answer(server, 201)


@bp.get("", strict_slashes=False)
@documented("List the MCP servers, by name: a workspace's, or the instance-wide ones", response=out.McpServerList,
            params=(_WORKSPACE,), errors=_READ_ERRORS)
@protected(Role.USER)
async def list_all(request: Request):
    rows = await mcp_service.list_servers(request.app.ctx.core, await _scope(request, Action.READ))
    return json({"message": SUCCESS, "servers": [mcp_service.server_view(s) for s in rows]})


@bp.get("/<server_id:str>")
@documented("Read an MCP server, its tools and its last error", response=out.McpServer,
            params=(_WORKSPACE,), errors=_READ_ERRORS)
@protected(Role.USER)
async def read(request: Request, server_id: str):
    workspace_id = await _scope(request, Action.READ)
    return _answer(await mcp_service.get_server(request.app.ctx.core, server_id, workspace_id))


@bp.put("/<server_id:str>")
@documented(
    "Replace an MCP server (every field; connects and lists its tools again)",
    body=McpServerBody, response=out.McpServer, params=(_WORKSPACE,),
    errors={409: "ConflictError: the name is taken (ignoring case) where the server is.", **_ERRORS},
)
@protected(Role.USER)
async def update(request: Request, server_id: str):
    workspace_id = await _scope(request)
    body = parse_body(request, McpServerBody)
    server = await mcp_service.update_server(request.app.ctx.core, server_id=server_id,
                                             workspace_id=workspace_id, **_fields(body))
    return _answer(server)


@bp.delete("/<server_id:str>")
@documented(
    "Delete an MCP server", response=out.Done, params=(_WORKSPACE,),
    errors={409: "ConflictError: workers use its tools (detail names them).", **_QUERY_ERRORS},
)
@protected(Role.USER)
async def delete(request: Request, server_id: str):
    workspace_id = await _scope(request)
    await mcp_service.delete_server(request.app.ctx.core, server_id=server_id, workspace_id=workspace_id)
    return json({"message": SUCCESS})


@bp.post("/<server_id:str>/refresh")
@documented("Connect and list the server's tools again (the outcome is kept)", response=out.McpServer,
            params=(_WORKSPACE,), errors=_QUERY_ERRORS)
@protected(Role.USER)
async def refresh(request: Request, server_id: str):
    workspace_id = await _scope(request)
    return _answer(await mcp_service.refresh_server(request.app.ctx.core, server_id=server_id,
                                                    workspace_id=workspace_id))
