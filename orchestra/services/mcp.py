"""MCP servers (SPEC §9): register, list, replace, delete and refresh; their tools join
the catalog as `<server name>.<tool name>`.

A server is shared (administrators manage it). Header and env values are secrets: the
store keeps one SecretBox ciphertext of each object and masked hints (`…abcd`); a PUT
that sends a hint back keeps the stored value while `url`/`command` is unchanged. A stdio
server runs only a bare command name that ORCHESTRA_MCP_STDIO_COMMANDS lists, with env
names no runtime interprets (stdio.py); an HTTP server's url obeys the egress rule.
Saving or refreshing connects to the server and lists its tools, holding no store
connection meanwhile; a server that cannot be reached is saved with its `last_error` and
keeps the tools it listed before.

Teams (SPEC §16): a server stored with a `workspace_id` is that workspace's, managed by
its admins (`workspace_rights.instance_or_workspace`: 404 for a non-member, 403 below
`admin`) and read by its members, its audit entries in the workspace's chain; its tools
are offered to that workspace's workers alone. One stored without is instance-wide,
managed by ADMINISTRATOR and above as before, its tools every workspace's. Names are
unique per workspace and among the instance-wide servers; a workspace's server of an
instance-wide server's name stands for it in that workspace (engine/tools/mcp/catalog.py),
so the workers "using" a server are the ones whose tool names resolve to it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from peewee import OP, Expression, IntegrityError, Value

from orchestra import redaction
from orchestra.db.database import release_connection
from orchestra.db.models import McpServer, Worker, iso, name_key, storable, utcnow
from orchestra.egress import SETTING as EGRESS_SETTING
from orchestra.engine.tools import ToolError
from orchestra.engine.tools.mcp.catalog import server_config
from orchestra.engine.tools.mcp.client import McpServerConfig
from orchestra.engine.tools.mcp.sessions import McpSession
from orchestra.engine.tools.mcp.stdio import (
    STDIO_SETTING,
    command_problem,
    command_refusal,
    env_refusal,
)
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.services import audit, workspace_rights
from orchestra.services.providers import BASE_URL
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action, Caller

TRANSPORTS = ("streamable_http", "stdio")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
URL_MAX = 1024
COMMAND_MAX = 1024
ARGS_MAX, ARG_MAX = 64, 4096
SECRETS_MAX, SECRET_MAX = 64, 8192
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")  # an RFC 9110 token
TIMEOUT_MAX = 3600.0
DEFAULT_TIMEOUT = 30.0
MASK = "…"
ERROR_MAX = 1000
SAVE_PROBE_SECONDS = 10.0  # a save waits at most this long for the listing (refresh: the timeout)



# --- field rules ----------------------------------------------------------------------------


def mask_secret(value: str) -> str:
    """`…abcd`: the last four characters of a value of 12 or more, else nothing of it."""
    return MASK + value[-4:] if len(value) >= 12 else MASK


def clean_server_name(value: str) -> str:
    name = unicodedata.normalize("NFKC", value).strip()
    if not NAME_PATTERN.match(name):
        raise ValidationError.field(
            "name", "must be 1 to 64 letters, digits, '_' or '-' (it prefixes the tool names)"
        )
    return name


def clean_transport(value: str) -> str:
    if value not in TRANSPORTS:
        raise ValidationError.field("transport", f"must be one of {', '.join(TRANSPORTS)}")
    return value


def clean_url(value: str | None) -> str:
    """An http(s) URL of the form providers.BASE_URL_PATTERN states (the OpenAPI document
    publishes it), not blank."""
    url = (value or "").strip()
    if not url or len(url) > URL_MAX or BASE_URL.search(value or "") is None:
        raise ValidationError.field("url", "must be an http:// or https:// URL whose host is an IP "
                                    "address or an ASCII host name, with an optional port up to 65535")
    return url


def clean_timeout(value: float | None) -> float:
    timeout = DEFAULT_TIMEOUT if value is None else float(value)
    if not 0 < timeout <= TIMEOUT_MAX:
        raise ValidationError.field("timeout_seconds", f"must be more than 0 and at most {TIMEOUT_MAX:g}")
    return timeout


def clean_command(value: str | None, allowed: frozenset[str]) -> str:
    """A bare command name listed in ORCHESTRA_MCP_STDIO_COMMANDS (a path is 422)."""
    command = (value or "").strip()
    if not command or len(command) > COMMAND_MAX or not storable(command) or "\n" in command:
        raise ValidationError.field("command", f"must be 1 to {COMMAND_MAX} characters, one line")
    problem = command_problem(command)
    if problem:
        raise ValidationError.field("command", problem)
    refused = command_refusal(command, allowed)
    if refused:
        raise ValidationError(refused, detail=[{"field": "command", "problem": refused, "setting": STDIO_SETTING}])
    return command


async def check_url_egress(core: Shared, url: str) -> None:
    """422 naming `url` and ORCHESTRA_EGRESS_ALLOW when the egress rule refuses it."""
    refusal = await core.settings.egress.url_refusal(url)
    if refusal:
        raise ValidationError(f"url: is refused: {refusal}", detail=[
            {"field": "url", "problem": f"is refused: {refusal}", "setting": EGRESS_SETTING}])


def clean_args(value: list[str] | None) -> list[str]:
    args = list(value or [])
    if len(args) > ARGS_MAX:
        raise ValidationError.field("args", f"must have at most {ARGS_MAX} items")
    for index, arg in enumerate(args):
        if not isinstance(arg, str) or len(arg) > ARG_MAX or "\x00" in arg:
            raise ValidationError.field(f"args.{index}", f"must be text of at most {ARG_MAX} characters, without NUL")
    return args


def _header_name_problem(name: str) -> str | None:
    return None if HEADER_NAME.match(name) else "must be an HTTP header name"


def _clean_secrets(
    field: str, value: dict[str, str] | None, stored: dict[str, str], hints: dict[str, str],
    name_problem: Callable[[str], str | None], header: bool, moved: str | None = None,
) -> dict[str, str]:
    """The new secret object: a value equal to the stored hint of its key keeps the
    stored value while the destination is unchanged (`moved` names what changed, if it
    did); any other masked value is refused."""
    items = dict(value or {})
    if len(items) > SECRETS_MAX:
        raise ValidationError.field(field, f"must have at most {SECRETS_MAX} entries")
    result: dict[str, str] = {}
    for key, secret in items.items():
        where = f"{field}.{key}"
        problem = name_problem(key)
        if problem:
            raise ValidationError.field(where, problem)
        if not isinstance(secret, str):
            raise ValidationError.field(where, "must be text")
        if secret.startswith(MASK):
            if moved and key in stored and hints.get(key) == secret:
                raise ValidationError.field(where, f"is a masked value, but the {moved} changed: send the "
                                            "value itself (a stored secret goes only where it was entered for)")
            if key in stored and hints.get(key) == secret:
                result[key] = stored[key]
                continue
            raise ValidationError.field(where, "is a masked value that does not match the stored one; send the value itself")
        if len(secret) > SECRET_MAX or "\x00" in secret:
            raise ValidationError.field(where, f"must be at most {SECRET_MAX} characters, without NUL")
        if header and not all(" " <= ch <= "~" or ch == "\t" for ch in secret):
            raise ValidationError.field(where, "must be printable ASCII (it travels in an HTTP header)")
        result[key] = secret
    return result


def _seal(core: Shared, secrets: dict[str, str]) -> tuple[str | None, dict[str, str]]:
    if not secrets:
        return None, {}
    redaction.remember_credentials(secrets.values())
    return (core.secrets.encrypt(json.dumps(secrets)),
            {key: mask_secret(value) for key, value in secrets.items()})


def _open(core: Shared, ciphertext: str | None, what: str, server: McpServer) -> dict[str, str]:
    if not ciphertext:
        return {}
    try:
        opened = json.loads(core.secrets.decrypt(ciphertext))
    except ValueError:
        raise ValidationError.field(
            what, f"the stored {what} of '{server.name}' cannot be decrypted (the server secret "
            "changed); send the values themselves",
        ) from None
    redaction.remember_credentials(opened.values())
    return opened


# --- views ------------------------------------------------------------------------------------


def server_view(server: McpServer) -> dict[str, Any]:
    """The API shape of a server; header and env values only ever masked."""
    stdio = server.transport == "stdio"
    return {
        "server_id": server.id,
        "id": server.id,
        "name": server.name,
        "workspace_id": server.workspace_id,
        "transport": server.transport,
        "url": None if stdio else server.url,
        "headers": {} if stdio else dict(server.headers_hint or {}),
        "command": server.command if stdio else None,
        "args": list(server.args or []) if stdio else [],
        "env": dict(server.env_hint or {}) if stdio else {},
        "timeout_seconds": server.timeout_seconds,
        "tools": [
            {"name": f"{server.name}.{t['name']}", "tool": t["name"],
             "description": t.get("description", ""), "parameters": t.get("parameters", {})}
            for t in server.tools or []
        ],
        "last_error": server.last_error,
        "refreshed_at": iso(server.refreshed_at),
        "created_at": iso(server.created_at),
        "updated_at": iso(server.updated_at),
    }


# --- listing a server's tools ---------------------------------------------------------------


async def probe(
    core: Shared, config: McpServerConfig, *, limit: float | None = None
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Connect, list the tools, close: `(tools, None)` or `(None, error)`. Bounded by the
    server's timeout (or `limit`, if lower); no store connection is held meanwhile."""
    if limit is not None and limit < config.timeout_seconds:
        config = dataclasses.replace(config, timeout_seconds=limit)
    await release_connection(core.db)
    session = McpSession(config, core.settings.mcp_stdio_allowed, core.settings.egress)
    try:
        await session.open()
        return await session.list_tools(), None
    except ToolError as exc:
        return None, exc.message[:ERROR_MAX]
    except TimeoutError:
        return None, f"The MCP server '{config.name}' did not list its tools within {config.timeout_seconds:g} s."
    except Exception as exc:  # noqa: BLE001 - any protocol failure is the server's error
        return None, f"The MCP server '{config.name}' failed to list its tools: {exc}"[:ERROR_MAX]
    finally:
        await session.close()


def _valid_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools with a usable name (no '.'-free check needed: the server name prefixes)."""
    seen: dict[str, dict[str, Any]] = {}
    for tool in tools:
        name = str(tool.get("name") or "")
        if name and len(name) <= 128 and storable(name) and name not in seen:
            seen[name] = tool
    return list(seen.values())


# --- operations -----------------------------------------------------------------------------


def audited_fields(server: McpServer) -> dict[str, Any]:
    """What an audit entry shows of a server's change (SPEC §16; instance-level): header
    and env values never (`_secrets_change`), nor the tools it lists."""
    return {"name": server.name, "transport": server.transport, "url": server.url, "command": server.command,
            "args": list(server.args or []), "timeout_seconds": server.timeout_seconds}


def _masked(names: Any) -> dict[str, str] | None:
    return {name: audit.MASK for name in sorted(names)} or None


def _names(server: McpServer | None) -> dict[str, list[str]]:
    """The header and env names a server has stored."""
    return {field: list(getattr(server, f"{field}_hint") or {}) if server is not None else []
            for field in ("headers", "env")}


def _secrets_changes(names: dict[str, list[str]], plain: dict[str, dict[str, str] | None],
                     after: dict[str, dict[str, str]]) -> dict[str, Any]:
    """`headers`/`env` of an entry: the names set before (`names`) and after, every value
    as "***", when the values changed (`plain`: those stored before, None: unreadable)."""
    changes = {}
    for field in ("headers", "env"):
        if plain.get(field) is not None and plain[field] == after[field]:
            continue
        if names[field] or after[field]:
            changes[field] = audit.change(_masked(names[field]), _masked(after[field]))
    return changes


def _stored_secrets(core: Shared, server: McpServer) -> dict[str, dict[str, str] | None]:
    """The stored header and env values (None for one that cannot be decrypted)."""
    opened: dict[str, dict[str, str] | None] = {}
    for field in ("headers", "env"):
        ciphertext = getattr(server, f"{field}_encrypted")
        try:
            opened[field] = json.loads(core.secrets.decrypt(ciphertext)) if ciphertext else {}
        except ValueError:
            opened[field] = None
    return opened


def _target(server: McpServer) -> dict[str, Any]:
    return audit.target("mcp_server", server.id, server.name)


async def scope_of(core: Shared, caller: Caller, workspace_id: str | None,
                   action: Action = Action.MANAGE) -> str | None:
    """Where a caller acts on MCP servers: `workspace_id`'s (404 for a non-member, 403
    naming the least role below `action`'s: `admin` to manage, any member to read), else
    the instance-wide ones (ADMINISTRATOR and above change them; every user reads them)."""
    return await workspace_rights.instance_or_workspace(core, caller, workspace_id, action)


def _in(workspace_id: str | None) -> Any:
    return workspace_rights.of_scope(McpServer.workspace_id, workspace_id)


def _name_taken(name: str, workspace_id: str | None = None) -> ConflictError:
    where = " in this workspace" if workspace_id else " among the instance-wide servers"
    return ConflictError(f"An MCP server named '{name}' already exists{where} (names ignore case).")


async def _ensure_name_free(core: Shared, name: str, *, workspace_id: str | None = None,
                            except_id: str | None = None) -> None:
    query = McpServer.select(McpServer.id).where((McpServer.name_key == name_key(name)) & _in(workspace_id))
    if except_id is not None:
        query = query.where(McpServer.id != except_id)
    if await core.db.exists(query):
        raise _name_taken(name, workspace_id)


def _shape(
    core: Shared, *, transport: str, url: str | None, headers: dict[str, str] | None,
    command: str | None, args: list[str] | None, env: dict[str, str] | None,
    stored: McpServer | None = None,
) -> dict[str, Any]:
    """The checked fields of a server (secrets in plain text, to be sealed)."""
    transport = clean_transport(transport)
    if transport == "streamable_http":
        for field, value in (("command", command), ("args", args), ("env", env)):
            if value:
                raise ValidationError.field(field, "is only for a stdio server")
        old = _open(core, stored.headers_encrypted, "headers", stored) if stored else {}
        hints = dict(stored.headers_hint or {}) if stored else {}
        url = clean_url(url)
        moved = "url" if stored and stored.url != url else None
        return {"url": url, "headers": _clean_secrets("headers", headers, old, hints, _header_name_problem, True, moved),
                "command": None, "args": [], "env": {}}
    for field, value in (("url", url), ("headers", headers)):
        if value:
            raise ValidationError.field(field, "is only for a streamable_http server")
    old = _open(core, stored.env_encrypted, "env", stored) if stored else {}
    hints = dict(stored.env_hint or {}) if stored else {}
    command = clean_command(command, core.settings.mcp_stdio_allowed)
    moved = "command" if stored and stored.command != command else None
    return {"url": None, "headers": {}, "command": command,
            "args": clean_args(args), "env": _clean_secrets("env", env, old, hints, env_refusal, False, moved)}


def _apply(core: Shared, server: McpServer, fields: dict[str, Any]) -> McpServerConfig:
    server.url, server.command, server.args = fields["url"], fields["command"], fields["args"]
    server.headers_encrypted, server.headers_hint = _seal(core, fields["headers"])
    server.env_encrypted, server.env_hint = _seal(core, fields["env"])
    return McpServerConfig(
        server_id=server.id, name=server.name, transport=server.transport, url=server.url,
        headers=fields["headers"], command=server.command, args=tuple(server.args),
        env=fields["env"], timeout_seconds=server.timeout_seconds,
    )


def _record_probe(server: McpServer, tools: list[dict[str, Any]] | None, error: str | None) -> None:
    if tools is not None:
        server.tools = _valid_tools(tools)
        server.last_error = None
    else:
        server.last_error = error
    server.refreshed_at = utcnow()


async def create_server(
    core: Shared,
    *,
    name: str,
    transport: str,
    url: str | None = None,
    headers: dict[str, str] | None = None,
    command: str | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout_seconds: float | None = None,
    created_by: str | None = None,
    workspace_id: str | None = None,
) -> McpServer:
    """Register a server (in `workspace_id`, else instance-wide; the caller's right is
    `scope_of`'s) and list its tools; 422 for a bad field (stdio: a command the operator
    did not allow), 409 for a name taken there."""
    name = clean_server_name(name)
    fields = _shape(core, transport=transport, url=url, headers=headers, command=command,
                    args=args, env=env)
    if fields["url"]:
        await check_url_egress(core, fields["url"])
    server = McpServer(name=name, transport=transport, timeout_seconds=clean_timeout(timeout_seconds),
                       created_by=created_by, tools=[], workspace_id=workspace_id)
    await _ensure_name_free(core, name, workspace_id=workspace_id)
    config = _apply(core, server, fields)
    _record_probe(server, *await probe(core, config, limit=SAVE_PROBE_SECONDS))
    changes = {**audit.diff({}, audited_fields(server)),
               **_secrets_changes(_names(None), {"headers": {}, "env": {}}, fields)}
    try:
        async with core.write_transaction():
            await server.asave(force_insert=True)
            await audit.record(core, action="mcp_server.create", target=_target(server), changes=changes,
                               workspace_id=workspace_id)
    except IntegrityError:
        raise _name_taken(name, workspace_id) from None
    core.caches.changed("mcp_server")
    return server


async def list_servers(core: Shared, workspace_id: str | None = None) -> list[McpServer]:
    """`workspace_id`'s servers, else the instance-wide ones, by name."""
    return await core.db.list(McpServer.select().where(_in(workspace_id))
                              .order_by(McpServer.name_key, McpServer.id))


async def get_server(core: Shared, server_id: str,
                    workspace_id: str | None = workspace_rights.EVERY_SCOPE) -> McpServer:
    """The MCP server of that id; given `workspace_id`, only one of that workspace (None:
    an instance-wide one): any other is 404, like a missing one."""
    return await workspace_rights.one_in_scope(McpServer, server_id, workspace_id, "MCP server")


async def _workers_using(core: Shared, names: list[str], workspace_id: str | None = None) -> list[Worker]:
    """Workers whose tools include one named `<name>.…` for a name given, as the server of
    that name in `workspace_id` (None: the instance-wide one) resolves them: a workspace's
    server, that workspace's workers; an instance-wide one, every user's but those of a
    workspace with its own server of that name."""
    if not names:
        return []
    prefixes = tuple(f"{n}." for n in names)
    query = Worker.select(Worker.id, Worker.name, Worker.owner, Worker.tools)
    condition = None
    for n in names:
        part = Expression(Worker.tools, OP.ILIKE, Value(f'%"{n}.%', converter=False))  # the JSON text
        condition = part if condition is None else condition | part
    if workspace_id is not None:
        condition = condition & (Worker.workspace_id == workspace_id)
    else:
        own = McpServer.select(McpServer.workspace_id).where(
            McpServer.name_key.in_([name_key(n) for n in names]) & McpServer.workspace_id.is_null(False))
        condition = condition & (Worker.workspace_id.is_null() | Worker.workspace_id.not_in(own))
    rows = await core.db.list(query.where(condition).order_by(Worker.name))
    return [w for w in rows if any(t.startswith(prefixes) for t in w.tools or [])]


async def update_server(
    core: Shared,
    *,
    server_id: str,
    name: str,
    transport: str,
    url: str | None = None,
    headers: dict[str, str] | None = None,
    command: str | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout_seconds: float | None = None,
    workspace_id: str | None = None,
) -> McpServer:
    """Replace the fields of `workspace_id`'s server (else an instance-wide one; a masked
    secret sent back keeps the stored one) and list its tools again; a rename carries the
    workers using its tools along."""
    server = await get_server(core, server_id, workspace_id)
    old_name, before, stored = server.name, audited_fields(server), _stored_secrets(core, server)
    old_names = _names(server)
    name = clean_server_name(name)
    fields = _shape(core, transport=transport, url=url, headers=headers, command=command,
                    args=args, env=env, stored=server if server.transport == transport else None)
    if fields["url"]:
        await check_url_egress(core, fields["url"])
    await _ensure_name_free(core, name, workspace_id=server.workspace_id, except_id=server.id)
    server.name, server.transport = name, transport
    server.timeout_seconds = clean_timeout(timeout_seconds)
    config = _apply(core, server, fields)
    _record_probe(server, *await probe(core, config, limit=SAVE_PROBE_SECONDS))
    server.updated_at = utcnow()
    changes = {**audit.diff(before, audited_fields(server)), **_secrets_changes(old_names, stored, fields)}
    async with core.write_transaction():
        try:
            saved = await server.asave()
        except IntegrityError:
            raise _name_taken(name, server.workspace_id) from None
        if not saved:  # deleted meanwhile: no change, no entry
            raise NotFoundError(f"No MCP server has the id '{server_id}'.")
        if name != old_name:
            for worker in await _workers_using(core, [old_name], server.workspace_id):
                tools = [f"{name}.{t[len(old_name) + 1:]}" if t.startswith(f"{old_name}.") else t
                         for t in worker.tools]
                await core.db.aexecute(Worker.update(tools=tools).where(Worker.id == worker.id))
        await audit.record(core, action="mcp_server.update", target=_target(server), changes=changes,
                           workspace_id=server.workspace_id)
    core.caches.changed("mcp_server")
    if name != old_name:  # workers' tool names were renamed with it
        core.caches.changed("worker")
    return server


async def delete_server(core: Shared, *, server_id: str, workspace_id: str | None = None) -> McpServer:
    """Delete a server (`workspace_id`'s, else an instance-wide one) whose tools no worker
    uses; 409 naming the workers otherwise."""
    async with core.write_transaction():
        server = await get_server(core, server_id, workspace_id)
        workers = await _workers_using(core, [server.name], server.workspace_id)
        if workers:
            names = ", ".join(f"'{w.name}'" for w in workers)
            raise ConflictError(
                f"MCP server '{server.name}' has tools used by worker(s) {names}; "
                "remove them from those workers first.",
                detail={"workers": [{"worker_id": w.id, "name": w.name, "owner_id": w.owner_id}
                                    for w in workers]},
            )
        await core.db.aexecute(McpServer.delete().where(McpServer.id == server.id))
        changes = {**audit.diff(audited_fields(server), {}),
                   **_secrets_changes(_names(server), {"headers": None, "env": None},
                                      {"headers": {}, "env": {}})}
        await audit.record(core, action="mcp_server.delete", target=_target(server), changes=changes,
                           workspace_id=server.workspace_id)
    core.caches.changed("mcp_server")
    return server


async def refresh_server(core: Shared, *, server_id: str, workspace_id: str | None = None) -> McpServer:
    """Connect and list the tools again (`workspace_id`'s server, else an instance-wide
    one); the outcome (tools, or last_error) is stored."""
    server = await get_server(core, server_id, workspace_id)
    try:
        config = server_config(server, core.secrets.decrypt)
        tools, error = await probe(core, config)
    except ValueError:
        tools, error = None, "The stored headers or env cannot be decrypted (the server secret changed)."
    values: dict[Any, Any] = {McpServer.refreshed_at: utcnow(), McpServer.last_error: error}
    if tools is not None:
        values[McpServer.tools] = _valid_tools(tools)
    await core.db.aexecute(McpServer.update(values).where(McpServer.id == server.id))
    core.caches.changed("mcp_server")
    return await get_server(core, server_id, workspace_id)
