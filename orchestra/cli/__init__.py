"""The `orchestra` command: serve, db, user (straight against the store), and login,
provider, node, tool, skill, worker, template, file, workflow, reload (through a server).

Command modules import their heavy dependencies (the store, the HTTP client, the
engine) inside the commands, so `orchestra --help` and shell completion stay quick
(benchmarks/bench_cli.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestra import __version__

app = typer.Typer(
    name="orchestra",
    help="Agent-orchestration backend: run the server, manage users, providers, workers, "
         "templates and workflow runs.",
    no_args_is_help=True,
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
        None, "--home", envvar="ORCHESTRA_HOME", help="Folder of the embedded store, secret key, uploads and login."
    ),
    db: Optional[str] = typer.Option(
        None, "--db", envvar="ORCHESTRA_DATABASE_URL",
        help="Database URL: sqlite:////abs/path.db or postgresql://user@host/db.",
    ),
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    ctx.obj = {"home": home, "database_url": db}


def _register_commands() -> None:
    from orchestra.cli import (db, files, login, node, provider, serve, skill, template, tool, user, worker,
                               workflow)

    serve.register(app)
    app.add_typer(db.app, name="db")
    app.add_typer(user.app, name="user")
    for area in (login, provider, node, tool, skill, worker, template, files, workflow):
        area.register(app)


_register_commands()


def hide_flag_types(command) -> None:
    """Flags take no value, so `--help` shows no `<bool>` type next to them."""
    for param in getattr(command, "params", []):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    make_help = command.get_help_option

    def help_option(ctx):
        option = make_help(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option  # Click builds `--help` anew for each context
    for sub in getattr(command, "commands", {}).values():
        hide_flag_types(sub)


def command():
    """The Click command behind `orchestra` (what `main` runs; tests invoke it too)."""
    built = typer.main.get_command(app)
    hide_flag_types(built)
    return built


def main() -> None:
    command()(prog_name="orchestra")
