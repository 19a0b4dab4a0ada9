"""The `orchestra` command: serve, db, user, provider, node, login/logout, worker, workflow."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestra import __version__

app = typer.Typer(
    name="orchestra",
    help="Agent-orchestration backend: run the server, manage users, providers and workflow runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"orchestra {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    home: Optional[Path] = typer.Option(
        None, "--home", envvar="ORCHESTRA_HOME", help="Folder of the embedded store, secret key and uploads."
    ),
    db: Optional[str] = typer.Option(
        None, "--db", envvar="ORCHESTRA_DATABASE_URL",
        help="Database URL: sqlite:////abs/path.db or postgresql://user@host/db.",
    ),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True),
) -> None:
    ctx.obj = {"home": home, "database_url": db}


def _register_commands() -> None:
    from orchestra.cli import db, login, node, provider, serve, user, worker, workflow

    serve.register(app)
    app.add_typer(db.app, name="db")
    app.add_typer(user.app, name="user")
    for area in (provider, node, login, worker, workflow):
        area.register(app)


_register_commands()


def main() -> None:
    app()
