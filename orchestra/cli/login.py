"""`orchestra login` / `logout` (`connect()`, the client every server command uses, is in remote.py).

Login keeps the server URL and the token pair in `$ORCHESTRA_HOME/credentials.json`
(mode 0600). A server command takes `--server` and `--token` (env `ORCHESTRA_SERVER`,
`ORCHESTRA_TOKEN`) and falls back to what login kept; a refreshed pair is written back.
"""

from __future__ import annotations

import sys

import typer

from orchestra.cli.console import ExitCode, fail, handle_errors, success
from orchestra.cli.passwords import read_password
from orchestra.cli.remote import kept_path


def _user_name(user: str | None) -> str:
    if user:
        return user
    if not sys.stdin.isatty():
        fail("no terminal to ask for the user name; pass --user NAME", ExitCode.USAGE)
    return typer.prompt("User name")


def register(app: typer.Typer) -> None:
    """Add `login` and `logout` to the root command."""

    @app.command()
    @handle_errors
    def login(
        ctx: typer.Context,
        server: str | None = typer.Option(None, "--server", envvar="ORCHESTRA_SERVER",
                                             help="Server URL, e.g. http://127.0.0.1:8000."),
        user: str | None = typer.Option(None, "--user", "-u", help="User name (prompted if missing)."),
        password_stdin: bool = typer.Option(False, "--password-stdin",
                                            help="Read the password from standard input."),
    ) -> None:
        """Log in to a server and keep the token pair for the other commands."""
        from orchestra.client import Client, Credentials, load_credentials, save_credentials

        path = kept_path(ctx)
        kept = load_credentials(path)
        if server is None:
            if kept is None:
                fail("pass --server URL (or set ORCHESTRA_SERVER)", ExitCode.USAGE)
            server = kept.server
        user_name = _user_name(user)
        password = read_password(password_stdin, confirm=False)
        with Client(server) as client:
            body = client.login(user_name, password)
            save_credentials(path, Credentials(
                server=client.server, access_token=body["access_token"],
                refresh_token=body["refresh_token"], user_name=user_name,
            ))
        success(f"logged in to {client.server} as {user_name}; credentials kept in {path}")

    @app.command()
    @handle_errors
    def logout(ctx: typer.Context) -> None:
        """Forget the kept credentials."""
        from orchestra.client import delete_credentials

        path = kept_path(ctx)
        if delete_credentials(path):
            success(f"logged out; removed {path}")
        else:
            success("not logged in; nothing to remove")
