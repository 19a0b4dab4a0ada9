"""`orchestra tool list`: the tool catalog (built-ins and MCP servers' tools), from
`/api/v1/resource/tool`; with `--workspace`, the tools that workspace's workers may use
(its own MCP servers' too, SPEC §16)."""

from __future__ import annotations

import typer

from orchestra.cli.console import handle_errors, out, print_json
from orchestra.cli.remote import JSON, SERVER, TOKEN, _or_global_workspace, connect, workspace_scope

app = typer.Typer(help="The tool catalog on a server (the names workers may use).", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="tool")


@app.command("list")
@handle_errors
def list_tools(ctx: typer.Context, workspace: str | None = typer.Option(
        None, "--workspace", callback=_or_global_workspace,
        help="A workspace by id or exact name: the tools its workers may use, its own MCP servers' included; "
             "default: `orchestra --workspace`, else $ORCHESTRA_WORKSPACE, else the built-ins and the "
             "instance-wide MCP servers' tools."),
        server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List the tools with their descriptions (--json adds each one's JSON Schema)."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        tools = client.get("/resource/tool", params=workspace_scope(client, workspace)).get("tools", [])
    if json_output:
        print_json(tools)
        return
    table = Table("name", "description")
    for t in tools:
        table.add_row(t["name"], t.get("description") or "")
    out.print(table)
