"""`orchestra key …`: your API keys through the server's `/api/v1/auth/key` (SPEC §11).

A key's secret is printed once, by `create`, on standard output (like `gh`): keep it
then; the server stores only its hash. KEY arguments take a key_id or a key's exact name.
A key reaches one workspace (SPEC §16): `--workspace` (or `ORCHESTRA_WORKSPACE`, a name or
an id; you need admin there) at creation, your personal one by default.
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
    without_message,
    workspace_id,
)

app = typer.Typer(help="Your API keys on a server: create (the secret is shown once), list, revoke.",
                  no_args_is_help=True)

PATH = "/auth/key"
SCOPES = "run:start, run:read, run:reply, run:cancel, template:read, template:write"


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="key")


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A name to tell the key apart."),
    scope: list[str] = typer.Option(..., "--scope", "-s", help=f"What the key may do (repeat): {SCOPES}."),
    template: list[str] = typer.Option(None, "--template", "-t",
                                       help="Limit run:start to this template: a template_id or exact name (repeat)."),
    expires_at: str | None = typer.Option(None, "--expires-at",
                                          help="ISO 8601 time the key stops working (no offset: UTC)."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Create a key in --workspace (default your personal one); prints its secret (orc_…)
    once — it is never shown again. The key reaches that workspace only."""
    from orchestra.cli.template import template_id

    body = {"name": name, "scopes": list(scope)}
    if expires_at:
        body["expires_at"] = expires_at
    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        if wid:
            body["workspace_id"] = wid
        if template:
            body["templates"] = [template_id(client, ref, wid) for ref in template]
        created = without_message(client.post(PATH, json=body))
    if json_output:
        print_json(created)
        return
    sys.stdout.write(created["key"] + "\n")
    success(f"created key {name} ({created['key_id']}); copy it now: it will not be shown again")


@app.command("list")
@handle_errors
def list_keys(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
              token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List your keys (never their secrets), with their workspace and last use (--workspace: that one's)."""
    from rich.table import Table

    from orchestra.cli.template import template_names

    with connect(ctx, server, token) as client:
        wid = workspace_id(client, workspace)
        keys = client.get(PATH, params={"workspace_id": wid} if wid else None).get("keys", [])
        names = template_names(client) if not json_output and any(k.get("templates") for k in keys) else {}
    if json_output:
        print_json(keys)
        return
    table = Table("name", "prefix", "scopes", "templates", "workspace", "last used", "expires")
    table.add_column("key_id", no_wrap=True, min_width=36)
    for k in keys:
        table.add_row(k["name"], f"orc_{k['prefix']}…", " ".join(k["scopes"]),
                      "any" if k["templates"] is None else ", ".join(names.get(t, t) for t in k["templates"]),
                      k.get("workspace_id") or "-", k["last_used_at"] or "never", k["expires_at"] or "never", k["key_id"])
    out.print(table)


@app.command()
@handle_errors
def revoke(ctx: typer.Context, key: str = typer.Argument(..., help="A key_id or a key's exact name."),
           yes: bool = YES, server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Revoke a key: refused at once, on every server process."""
    confirm(f"revoke key {key}", yes)
    with connect(ctx, server, token) as client:
        key_id = resolve_named(client, PATH, "keys", "key_id", key, "key")
        client.delete(f"{PATH}/{key_id}")
    success(f"revoked key {key}")
