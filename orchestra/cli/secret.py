"""`orchestra secret …`: secrets for HTTP steps through `/api/v1/resource/secret`
(instance-wide: ADMINISTRATOR and above; with `--workspace`, that workspace's own: its
admins, SPEC §16), each with the hosts HTTP steps may send it to (`--host`,
repeated). A value is read from a hidden prompt or, with `--value-stdin`, one line of
standard input; never from the command line."""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import (
    JSON,
    SERVER,
    TOKEN,
    YES,
    _or_global_workspace,
    confirm,
    connect,
    without_message,
    workspace_id,
)

app = typer.Typer(help="Secrets for HTTP steps on a server: set, hosts, list, delete (values are never shown).",
                  no_args_is_help=True)

NAME = typer.Argument(..., help="The secret's name, as templates write it: {{ secrets.NAME }}.")
HOST_HELP = ("A host HTTP steps may send the secret to (repeat for more): api.example.com, *.example.com, "
             "127.0.0.1:8080, [::1]; no port: any port. Compared with the host as written in the URL.")
PATH = "/resource/secret"
WORKSPACE: str | None = typer.Option(
    None, "--workspace", callback=_or_global_workspace,
    help="A workspace by id or exact name: its own secrets (you need admin there); default: "
         "`orchestra --workspace`, else $ORCHESTRA_WORKSPACE, else the instance-wide ones (ADMINISTRATOR+).")


def _where(client, workspace: str | None) -> dict:
    """The query naming the workspace (none: the instance-wide secrets)."""
    wid = workspace_id(client, workspace)
    return {"workspace_id": wid} if wid else {}


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="secret")


def _read_value(from_stdin: bool) -> str:
    if from_stdin:
        value = sys.stdin.readline().rstrip("\r\n")
        if not value:
            fail("no value on standard input", ExitCode.USAGE)
        return value
    if not sys.stdin.isatty():
        fail("no terminal for the value prompt; use --value-stdin", ExitCode.USAGE)
    return typer.prompt("Value", hide_input=True, confirmation_prompt=True)


@app.command("set")
@handle_errors
def set_secret(
    ctx: typer.Context, name: str = NAME,
    value_stdin: bool = typer.Option(False, "--value-stdin", help="Read the value from one line of stdin."),
    host: list[str] = typer.Option([], "--host", help=HOST_HELP + " Needed for a new secret; for an "
                                   "existing one, given hosts replace its hosts."),
    workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Store a secret with its hosts, or replace the value (and hosts) of an existing one."""
    from orchestra.client import APIError

    value = _read_value(value_stdin)
    hosts = {"hosts": list(host)} if host else {}
    with connect(ctx, server, token) as client:
        where = _where(client, workspace)
        if not host:  # only an existing secret may keep its hosts
            try:
                stored, verb = without_message(client.put(f"{PATH}/{name}", json={"value": value},
                                                          params=where)), "replaced"
            except APIError as exc:
                if exc.status != 404:
                    raise
                fail(f"a new secret needs its hosts: --host api.example.com (where HTTP steps may send {name})",
                     ExitCode.USAGE)
        else:
            try:
                stored, verb = without_message(client.post(
                    PATH, json={"name": name, "value": value, **hosts, **where})), "stored"
            except APIError as exc:
                if exc.status != 409:
                    raise
                stored, verb = without_message(client.put(f"{PATH}/{name}", json={"value": value, **hosts},
                                                          params=where)), "replaced"
    if json_output:
        print_json(stored)
    success(f"{verb} secret {stored['name']} ({stored['hint']}), sent only to {_hosts(stored)}")


def _hosts(stored: dict) -> str:
    return ", ".join(stored.get("hosts") or []) or "no host (no step may send it: set its hosts)"


@app.command("hosts")
@handle_errors
def set_hosts(
    ctx: typer.Context, name: str = NAME,
    host: list[str] = typer.Option(..., "--host", help=HOST_HELP), workspace: str | None = WORKSPACE,
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Set where a secret may be sent (a secret stored before hosts existed needs this)."""
    with connect(ctx, server, token) as client:
        stored = without_message(client.put(f"{PATH}/{name}", json={"hosts": list(host)},
                                            params=_where(client, workspace)))
    if json_output:
        print_json(stored)
    success(f"secret {stored['name']} is sent only to {_hosts(stored)}")


@app.command("list")
@handle_errors
def list_secrets(ctx: typer.Context, workspace: str | None = WORKSPACE, server: str | None = SERVER,
                 token: str | None = TOKEN, json_output: bool = JSON) -> None:
    """List the secrets (a workspace's, or the instance-wide ones): names and hints (…abcd), never values."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        rows = client.get(PATH, params=_where(client, workspace)).get("secrets", [])
    if json_output:
        print_json(rows)
        return
    table = Table("name", "hint", "hosts", "updated_at")
    for row in rows:
        table.add_row(row["name"], row["hint"], ", ".join(row.get("hosts") or []) or "(none: unusable)",
                      row.get("updated_at") or "")
    out.print(table)


@app.command()
@handle_errors
def delete(ctx: typer.Context, name: str = NAME, yes: bool = YES, workspace: str | None = WORKSPACE,
           server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Delete a secret (a template naming it then fails that step when it runs)."""
    confirm(f"delete secret {name}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{PATH}/{name}", params=_where(client, workspace))
    success(f"deleted secret {name}")
