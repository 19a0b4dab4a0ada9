"""`orchestra user …`: manage accounts straight against the store.

These commands open the store themselves (no server, no login): they are how the
first SUPER_ADMINISTRATOR is made before a server runs, and how an operator on the
server's machine repairs accounts. `promote` only raises a role and `demote` only
lowers one; `set-role` sets any.
"""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, out, print_json, run, success
from orchestra.cli.passwords import read_password
from orchestra.cli.store import open_core, settings_from
from orchestra.services.roles import ROLE_NAMES, Role

app = typer.Typer(
    help="Create, list and manage users straight against the store (no server needed: "
         "this is how the first SUPER_ADMINISTRATOR is made). Use --home/--db to pick the store.",
    no_args_is_help=True,
)

ROLE_HELP = f"One of {', '.join(ROLE_NAMES)}."


def _role(value: str) -> Role:
    try:
        return Role(value.upper())
    except ValueError:
        fail(f"unknown role {value!r}; one of {', '.join(ROLE_NAMES)}", ExitCode.USAGE)


async def resolve_user(core, name_or_id: str):
    """A user by name (case-insensitive) or by user_id."""
    from orchestra.errors import UserNotExistError
    from orchestra.services import auth

    try:
        return await auth.find_user(core, name_or_id)
    except UserNotExistError:
        try:
            return await auth.get_user(core, name_or_id)
        except UserNotExistError:
            raise UserNotExistError(f"No user is named or has the id '{name_or_id}'.") from None


PASSWORD_STDIN = typer.Option(False, "--password-stdin", help="Read the password from standard input.")


@app.command()
@handle_errors
def create(
    ctx: typer.Context,
    user_name: str = typer.Argument(..., help="The new user's name."),
    role: str = typer.Option("USER", "--role", help=ROLE_HELP),
    password_stdin: bool = PASSWORD_STDIN,
) -> None:
    """Create a user (for example the first SUPER_ADMINISTRATOR)."""
    chosen = _role(role)
    password = read_password(password_stdin)

    async def action():
        from orchestra.services import auth

        async with open_core(settings_from(ctx)) as core:
            return await auth.register(core, user_name=user_name, password=password, role=chosen)

    user = run(action())
    success(f"created {user.user_name} ({user.role}), user_id {user.id}")


@app.command("list")
@handle_errors
def list_users(ctx: typer.Context, json_output: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List every user, oldest first."""
    from orchestra.db.models import iso
    from orchestra.services import auth

    async def action():
        async with open_core(settings_from(ctx)) as core:
            return await auth.list_users(core)

    users = run(action())
    rows = [{"user_id": u.id, "user_name": u.user_name, "role": u.role, "created_at": iso(u.created_at)} for u in users]
    if json_output:
        print_json(rows)
        return
    from rich.table import Table

    table = Table("user_name", "role")
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("user_id", no_wrap=True, min_width=36)
    for row in rows:
        created = row["created_at"][:16].replace("T", " ")
        table.add_row(row["user_name"], row["role"], created, row["user_id"])
    out.print(table)


def _change_role(ctx: typer.Context, name_or_id: str, role: Role, direction: str = "set") -> None:
    """Set the role; `direction` "raise" refuses a lower role, "lower" a higher one (exit 2)."""
    from orchestra.services import auth

    async def action():
        async with open_core(settings_from(ctx)) as core:
            user = await resolve_user(core, name_or_id)
            current = Role(user.role)
            if current == role and direction != "set":
                return user, False
            if direction == "raise" and role.rank < current.rank:
                return user, "promote only raises a role"
            if direction == "lower" and role.rank > current.rank:
                return user, "demote only lowers a role"
            return await auth.set_role(core, user_id=user.id, new_role=role), True

    user, changed = run(action())
    if isinstance(changed, str):
        fail(f"{user.user_name} is {user.role}: {changed}; use 'orchestra user set-role "
             f"{user.user_name} {role.value}' to set it to {role.value}", ExitCode.USAGE)
    success(f"{user.user_name} is now {user.role}" if changed else f"{user.user_name} is already {user.role}")


@app.command()
@handle_errors
def promote(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="User name or user_id."),
    to: str = typer.Option("SUPER_ADMINISTRATOR", "--to", help=ROLE_HELP),
) -> None:
    """Raise a user's role (to SUPER_ADMINISTRATOR unless --to says otherwise); never lowers it."""
    _change_role(ctx, user, _role(to), "raise")


@app.command()
@handle_errors
def demote(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="User name or user_id."),
    to: str = typer.Option("USER", "--to", help=ROLE_HELP),
) -> None:
    """Lower a user's role (to USER unless --to says otherwise); never raises it."""
    _change_role(ctx, user, _role(to), "lower")


@app.command("set-role")
@handle_errors
def set_role(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="User name or user_id."),
    role: str = typer.Argument(..., help=ROLE_HELP),
) -> None:
    """Set a user's role."""
    _change_role(ctx, user, _role(role))


@app.command()
@handle_errors
def passwd(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="User name or user_id."),
    password_stdin: bool = PASSWORD_STDIN,
) -> None:
    """Set a user's password (ends the user's sessions)."""
    password = read_password(password_stdin)

    async def action():
        from orchestra.services import auth

        async with open_core(settings_from(ctx)) as core:
            target = await resolve_user(core, user)
            await auth.set_password(core, user_id=target.id, password=password)
            return target

    target = run(action())
    success(f"password of {target.user_name} changed; their sessions were ended")


@app.command()
@handle_errors
def delete(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="User name or user_id."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a user and everything the user owns."""
    if not yes:
        if not sys.stdin.isatty():
            fail("refusing to delete without --yes when there is no terminal to confirm", ExitCode.USAGE)
        typer.confirm(f"Delete {user} and everything they own?", abort=True)

    async def action():
        from orchestra.services import auth

        async with open_core(settings_from(ctx)) as core:
            target = await resolve_user(core, user)
            return await auth.delete_user(core, user_id=target.id)

    target = run(action())
    success(f"deleted {target.user_name}")
