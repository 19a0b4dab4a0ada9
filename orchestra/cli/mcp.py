"""`orchestra mcp …`: MCP servers through the server's `/api/v1/resource/mcp` (SPEC §9).

SERVER arguments take a server_id or a server's exact name. Reading is open to every
signed-in user; adding, refreshing and removing need ADMINISTRATOR or above. Header and
env values are secrets: the server shows them masked (`…abcd`). Each command takes
`--workspace` (or `orchestra --workspace`, or $ORCHESTRA_WORKSPACE; an id or exact name):
that workspace's own servers (its admins change them, its members read them; SPEC §16);
without it, the instance-wide ones.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from orchestra.cli.console import ExitCode, err, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    YES,
    confirm,
    connect,
    own_scope,
    own_workspace_option,
    resolve_named,
    show_fields,
)

app = typer.Typer(help="MCP servers on a server: add, list, show, refresh, remove.", no_args_is_help=True)

MCP_SERVER = typer.Argument(..., help="A server_id or an MCP server's exact name.")
FIELDS = ("server_id", "name", "transport", "url", "headers", "command", "args", "env",
          "timeout_seconds", "last_error", "refreshed_at", "created_at")
PATH = "/resource/mcp"
WORKSPACE: str | None = own_workspace_option("MCP servers")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="mcp")


def _server_id(client, ref: str, where: dict) -> str:
    """The server_id of SERVER among the servers `where` names."""
    return resolve_named(client, PATH, "servers", "server_id", ref, "MCP server", params=where)


def _secrets(names: list[str], option: str) -> dict[str, str]:
    """Header or env values are secrets and never come from argv: each `--header NAME`
    takes its value from a hidden prompt on a terminal, else from the next line of stdin."""
    values: dict[str, str] = {}
    for name in names:
        if "=" in name or not name:
            fail(f"{option} takes a NAME only; its value is a secret, typed at the prompt or "
                 "piped on stdin (one line per NAME)", ExitCode.USAGE)
        if sys.stdin.isatty():
            values[name] = typer.prompt(f"{name}", hide_input=True)
        else:
            line = sys.stdin.readline()
            if not line:
                fail(f"no value on stdin for {option} {name}", ExitCode.USAGE)
            values[name] = line.rstrip("\n")
    return values


def _warn_unreachable(server: dict[str, Any]) -> None:
    if server.get("last_error"):
        err.print(f"[yellow]warning:[/] {server['last_error']}", markup=True, highlight=False)


def _tools_table(server: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table("tool", "description")
    for tool in server.get("tools", []):
        table.add_row(tool["name"], tool.get("description") or "")
    out.print(table)


@app.command()
@handle_errors
def add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The server's name: letters, digits, _ or - (prefixes its tools)."),
    url: str | None = typer.Option(None, "--url", help="streamable HTTP: the server's MCP endpoint."),
    command: str | None = typer.Option(
        None, "--command", help="stdio: the program to start (ORCHESTRA_MCP_STDIO_COMMANDS must list it)."),
    arg: list[str] = typer.Option([], "--arg", help="stdio: one argument (repeat for more)."),
    header: list[str] = typer.Option(
        [], "--header", help="streamable HTTP: a header NAME; its value is read hidden (or a line of stdin)."),
    env: list[str] = typer.Option(
        [], "--env", help="stdio: a variable NAME; its value is read hidden (or a line of stdin)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds for connecting and each call (30)."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Add an MCP server (instance-wide: ADMINISTRATOR and above; in --workspace: its admins;
    it is connected and its tools listed); prints its server_id."""
    if (url is None) == (command is None):
        fail("give either --url (streamable HTTP) or --command (stdio)", ExitCode.USAGE)
    body: dict[str, Any] = {"name": name, "transport": "stdio" if command else "streamable_http"}
    if url is not None:
        body.update(url=url, headers=_secrets(header, "--header"))
    else:
        body.update(command=command, args=list(arg), env=_secrets(env, "--env"))
    if timeout is not None:
        body["timeout_seconds"] = timeout
    with connect(ctx, server, token) as client:
        created = client.post(PATH, json={**body, **own_scope(client, workspace)})
    made = created["server"]
    if json_output:
        print_json(made)
    else:
        sys.stdout.write(created["server_id"] + "\n")
    _warn_unreachable(made)
    success(f"added MCP server {made['name']} ({created['server_id']}) with {len(made['tools'])} tool(s)")


@app.command("list")
@handle_errors
def list_servers(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
                 token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List the MCP servers (a workspace's, or the instance-wide ones): transport, where,
    tools, and whether the last connection worked."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        servers = client.get(PATH, params=own_scope(client, workspace)).get("servers", [])
    if json_output:
        print_json(servers)
        return
    table = Table("name", "transport", "target", "tools", "status")
    table.add_column("server_id", no_wrap=True, min_width=36)
    for s in servers:
        target = s.get("url") or " ".join([s.get("command") or "", *s.get("args", [])]).strip()
        status = "error" if s.get("last_error") else "ok"
        table.add_row(s["name"], s["transport"], target, str(len(s.get("tools", []))), status, s["server_id"])
    out.print(table)


@app.command()
@handle_errors
def show(ctx: typer.Context, mcp_server: str = MCP_SERVER, workspace: str | None = WORKSPACE,
         server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Show one MCP server (secrets masked) and its tools."""
    with connect(ctx, server, token) as client:
        where = own_scope(client, workspace)
        body = client.get(f"{PATH}/{_server_id(client, mcp_server, where)}", params=where)["server"]
    show_fields(body, FIELDS, json_output)
    if not json_output:
        _tools_table(body)


@app.command()
@handle_errors
def refresh(ctx: typer.Context, mcp_server: str = MCP_SERVER, workspace: str | None = WORKSPACE,
            server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """Connect and list the server's tools again; exits 6 when it cannot be reached."""
    with connect(ctx, server, token) as client:
        where = own_scope(client, workspace)
        body = client.post(f"{PATH}/{_server_id(client, mcp_server, where)}/refresh", params=where)["server"]
    if json_output:
        print_json(body)
    else:
        _tools_table(body)
    if body.get("last_error"):
        fail(body["last_error"], ExitCode.UNAVAILABLE)
    success(f"refreshed MCP server {body['name']}: {len(body['tools'])} tool(s)")


@app.command()
@handle_errors
def remove(ctx: typer.Context, mcp_server: str = MCP_SERVER, yes: bool = YES, workspace: str | None = WORKSPACE,
           server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Remove an MCP server (refused while a worker uses its tools)."""
    confirm(f"remove MCP server {mcp_server}", yes)
    with connect(ctx, server, token) as client:
        where = own_scope(client, workspace)
        client.delete(f"{PATH}/{_server_id(client, mcp_server, where)}", params=where)
    success(f"removed MCP server {mcp_server}")
