"""`orchestra account …`: users through the server's `/api/v1/auth` routes — what a
remote SUPER_ADMINISTRATOR (or a new user registering) does without the store at hand.
`orchestra user …` does the same straight against the store on the server's machine.

USER arguments take a user_name (exact, as `account list` shows it) or a user_id.
"""

from __future__ import annotations

import typer

from orchestra.cli.console import (
    ExitCode,
    fail,
    handle_errors,
    out,
    print_json,
    print_people,
    success,
)
from orchestra.cli.passwords import read_password
from orchestra.cli.remote import JSON, SERVER, TOKEN, YES, confirm, connect
from orchestra.services.roles import ROLE_NAMES as ROLES

app = typer.Typer(help="Users through a server's API: register, list, set-role, delete (remote administration).",
                  no_args_is_help=True)

USER = typer.Argument(..., help="A user_name or user_id.")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="account")


def _user(client, ref: str) -> dict:
    users = client.get("/auth/list").get("users", [])
    for u in users:
        if ref == u["user_id"] or ref.casefold() == u["user_name"].casefold():
            return u
    fail(f"unknown user {ref!r} (no user has that name or id)", ExitCode.NOT_FOUND)


@app.command("register")
@handle_errors
def register_user(
    ctx: typer.Context,
    user_name: str = typer.Argument(..., help="The new user's name."),
    password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from standard input."),
    server: str | None = SERVER, json_output: bool = JSON,
) -> None:
    """Register a new USER on a server (no login needed); prints the user_id."""
    password = read_password(password_stdin)
    with connect(ctx, server, None) as client:
        client.access_token = None  # registering is anonymous
        body = client.post("/auth/register", json={"user_name": user_name, "password": password})
    if json_output:
        print_json({"user_id": body["user_id"]})
    else:
        out.print(body["user_id"], highlight=False)
    success(f"registered {user_name}; log in with: orchestra login --user {user_name}")


@app.command("list")
@handle_errors
def list_users(ctx: typer.Context, server: str | None = SERVER, token: str | None = TOKEN,
               json_output: bool = JSON) -> None:
    """List the users, oldest first (SUPER_ADMINISTRATOR)."""
    with connect(ctx, server, token) as client:
        users = client.get("/auth/list").get("users", [])
    if json_output:
        print_json(users)
        return
    print_people(users)


@app.command("set-role")
@handle_errors
def set_role(ctx: typer.Context, user: str = USER,
             role: str = typer.Argument(..., help=f"One of {', '.join(ROLES)}."),
             server: str | None = SERVER, token: str | None = TOKEN) -> None:
    """Set a user's role (SUPER_ADMINISTRATOR; ends that user's sessions)."""
    if role.upper() not in ROLES:
        fail(f"unknown role {role!r}; one of {', '.join(ROLES)}", ExitCode.USAGE)
    with connect(ctx, server, token) as client:
        target = _user(client, user)
        body = client.put("/auth/authority", json={"user_id": target["user_id"], "new_authority": role.upper()})
    success(f"{target['user_name']} is now {body['new_authority']}")


@app.command()
@handle_errors
def delete(ctx: typer.Context, user: str = USER, yes: bool = YES, server: str | None = SERVER,
           token: str | None = TOKEN) -> None:
    """Delete a user and everything the user owns (SUPER_ADMINISTRATOR)."""
    confirm(f"delete user {user} and everything they own", yes)
    with connect(ctx, server, token) as client:
        target = _user(client, user)
        client.delete(f"/auth/{target['user_id']}")
    success(f"deleted {target['user_name']}")
