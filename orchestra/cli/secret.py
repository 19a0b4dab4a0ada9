"""`orchestra secret …`: secrets for HTTP steps through `/api/v1/resource/secret`
(ADMINISTRATOR and above). A value is read from a hidden prompt or, with
`--value-stdin`, one line of standard input; never from the command line."""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, success
from orchestra.cli.remote import JSON, SERVER, TOKEN, YES, confirm, connect, without_message

app = typer.Typer(help="Secrets for HTTP steps on a server: set, list, delete (values are never shown).",
                  no_args_is_help=True)

NAME = typer.Argument(..., help="The secret's name, as templates write it: {{ secrets.NAME }}.")
PATH = "/resource/secret"


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
    server: str | None = SERVER, token: str | None = TOKEN, json_output: bool = JSON,
) -> None:
    """Store a secret, or replace the value of an existing one."""
    from orchestra.client import APIError

    value = _read_value(value_stdin)
    with connect(ctx, server, token) as client:
        try:
            stored, verb = without_message(client.post(PATH, json={"name": name, "value": value})), "stored"
        except APIError as exc:
            if exc.status != 409:
                raise
            stored, verb = without_message(client.put(f"{PATH}/{name}", json={"value": value})), "replaced"
    if json_output:
        print_json(stored)
    success(f"{verb} secret {stored['name']} ({stored['hint']})")


@app.command("list")
@handle_errors
def list_secrets(ctx: typer.Context, server: str | None = SERVER, token: str | None = TOKEN,
                 json_output: bool = JSON) -> None:
    """List the secrets: names and hints (…abcd), never values."""
    from rich.table import Table

    with connect(ctx, server, token) as client:
        rows = client.get(PATH).get("secrets", [])
    if json_output:
        print_json(rows)
        return
    table = Table("name", "hint", "updated_at")
    for row in rows:
        table.add_row(row["name"], row["hint"], row.get("updated_at") or "")
    out.print(table)


@app.command()
@handle_errors
def delete(ctx: typer.Context, name: str = NAME, yes: bool = YES, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Delete a secret (a template naming it then fails that step when it runs)."""
    confirm(f"delete secret {name}", yes)
    with connect(ctx, server, token) as client:
        client.delete(f"{PATH}/{name}")
    success(f"deleted secret {name}")
