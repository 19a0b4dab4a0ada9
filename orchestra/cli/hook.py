"""`orchestra hook …`: your inbound webhooks through `/api/v1/workflow/hook` (SPEC §11).

`create` prints the hook's URL and its signing secret (whsec_…) once; senders sign
calls per Standard Webhooks with it. TEMPLATE takes a template_id or an exact name.
"""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    WORKSPACE,
    YES,
    confirm,
    connect,
    resolve_named,
    show_fields,
    without_message,
    workspace_id,
)

app = typer.Typer(help="Inbound webhooks on a server: create (the secret is shown once), list, "
                       "show, delete.", no_args_is_help=True)

PATH = "/workflow/hook"
HOOK = typer.Argument(..., help="A hook_id.")
FIELDS = ("hook_id", "url", "template_id", "template_name", "input", "created_at")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="hook")


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    template: str = typer.Argument(..., help="The template its calls run (a template_id or exact name)."),
    input: str = typer.Option("body", "--input", "-i",
                              help="CEL over body, headers and query: the run's input."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a hook; prints its URL and its signing secret (shown this once)."""
    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        template_id = resolve_named(client, "/workflow/template", "templates", "template_id", template,
                                    "template", params={"workspace_id": wid} if wid else None)
        body = {"template_id": template_id, "input": input}
        if wid:
            body["workspace_id"] = wid
        created = without_message(client.post(PATH, json=body))
    if json_output:
        print_json(created)
        return
    sys.stdout.write(f"{created['url']}\n{created['secret']}\n")
    success(f"created hook {created['hook_id']}; copy the secret now: it will not be shown again")


@app.command("list")
@handle_errors
def list_hooks(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
               token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List your hooks and your workspaces'."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        hooks = client.get(PATH, params={"workspace_id": wid} if wid else None).get("hooks", [])
    if json_output:
        print_json(hooks)
        return
    table = Table("template", "input", "url")
    table.add_column("hook_id", no_wrap=True, min_width=36)
    for h in hooks:
        table.add_row(h["template_name"], h["input"], h["url"], h["hook_id"])
    out.print(table)


@app.command()
@handle_errors
def show(ctx: typer.Context, hook: str = HOOK, server: str | None = SERVER, token: str | None = TOKEN,
         json_output: bool = JSON) -> None:
    """Show one hook (never its secret)."""
    with connect(ctx, server, token) as client:
        body = client.get(f"{PATH}/{hook}")["hook"]
    show_fields(body, FIELDS, json_output)


@app.command()
@handle_errors
def delete(ctx: typer.Context, hook: str = HOOK, yes: bool = YES, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Delete a hook: its URL answers 404 from then on."""
    confirm(f"delete hook {hook}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{PATH}/{hook}")
    success(f"deleted hook {hook}")
