"""The `orchestra` command: serve, db, user, audit verify (straight against the store), and login,
account, key, hook, provider, node, tool, mcp, secret, skill, worker, template, file, workflow,
versions, schedule, subscription, audit list|export, reload (through
a server).

Command modules import their heavy dependencies (the store, the HTTP client, the
engine) inside the commands, so `orchestra --help` and shell completion stay quick
(benchmarks/bench_cli.py).
"""

from __future__ import annotations

from pathlib import Path

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
    home: Path | None = typer.Option(
        None, "--home", envvar="ORCHESTRA_HOME", help="Folder of the embedded store, secret key, uploads and login."
    ),
    db: str | None = typer.Option(
        None, "--db", envvar="ORCHESTRA_DATABASE_URL",
        help="Database URL: sqlite:////abs/path.db or postgresql://user@host/db.",
    ),
    workspace: str | None = typer.Option(
        None, "--workspace", envvar="ORCHESTRA_WORKSPACE",
        help="The workspace (id or exact name) of every command after it; a command's own "
             "--workspace wins (default: your personal one; lists: all of yours)."),
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    ctx.obj = {"home": home, "database_url": db, "workspace": workspace}


def _register_commands() -> None:
    from orchestra.cli import (
        account,
        audit,
        db,
        files,
        hook,
        key,
        login,
        mcp,
        node,
        provider,
        schedule,
        secret,
        serve,
        skill,
        subscription,
        template,
        tool,
        usage,
        user,
        versions,
        worker,
        workflow,
        workspace,
    )

    serve.register(app)
    app.add_typer(db.app, name="db")
    app.add_typer(user.app, name="user")
    for area in (login, account, key, provider, node, tool, mcp, secret, skill, worker, template, files,
                 workflow, versions, schedule, subscription, hook, usage, audit, workspace):
        area.register(app)
    _every_command_takes_workspace(app)


def _every_command_takes_workspace(group: typer.Typer) -> None:
    """SPEC §16: `--workspace` is an option of every command. Commands that act in a
    workspace declare it (`remote.WORKSPACE`); every other one gets `UNUSED_WORKSPACE`
    here, so scripts may pass it (or set ORCHESTRA_WORKSPACE) to any command alike."""
    for info in group.registered_commands:
        info.callback = _taking_workspace(info.callback)
    for sub in group.registered_groups:
        _every_command_takes_workspace(sub.typer_instance)


def _taking_workspace(callback):
    """`callback` with a `--workspace` it ignores, unless it has a `workspace` parameter
    (its option, or `workspace delete`'s argument, which names the workspace itself)."""
    import functools
    import inspect

    from orchestra.cli.remote import UNUSED_WORKSPACE

    signature = inspect.signature(callback)
    if "workspace" in signature.parameters:
        return callback

    @functools.wraps(callback)
    def command(*args, workspace: str | None = None, **kwargs):
        return callback(*args, **kwargs)

    extra = inspect.Parameter("workspace", inspect.Parameter.KEYWORD_ONLY, default=UNUSED_WORKSPACE,
                              annotation=str | None)
    command.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])
    command.__annotations__ = {**callback.__annotations__, "workspace": str | None}
    return command


_register_commands()


def hide_flag_types(command, quick=None) -> None:
    """Flags take no value, so `--help` shows no `<bool>` type next to them, arguments no
    `<str>` (their name says what they are), other options a word (TEXT, N); options left
    unset or given as text skip typer's pydantic coercion (see `_quick_coercion`)."""
    for param in getattr(command, "params", []):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif type(param).__name__.endswith("Argument"):  # its name says it: no `<str>` beside it
            param.display_type_rich = lambda ctx: None
        elif param.metavar is None:  # not typer's `<str>`, `<int range>`: a word, as Click's own
            param.metavar = _metavar(param)
        if quick and getattr(param, "_runtime_param", "absent") is None:
            param._runtime_param = quick(param.type_descriptor)
    make_help = command.get_help_option

    def help_option(ctx):
        option = make_help(ctx)
        if option is not None:
            option.metavar = ""
            if quick and getattr(option, "_runtime_param", "absent") is None:
                option._runtime_param = quick(option.type_descriptor)
        return option

    command.get_help_option = help_option  # Click builds `--help` anew for each context
    for sub in getattr(command, "commands", {}).values():
        hide_flag_types(sub, quick)


def _metavar(param) -> str:
    """What `--help` shows for an option's value: its kind (N, NUMBER, TEXT)."""
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    kinds = {int: "N", int | None: "N", float: "NUMBER", float | None: "NUMBER"}
    return kinds.get(annotation, "TEXT")


def _quick_coercion():
    """typer (0.2x) coerces every non-flag value, even an unset one, through a pydantic
    TypeAdapter, and importing pydantic alone costs a command ~0.15 s. Unset values and
    text for `str` parameters need no coercion, so they are answered here; anything else
    goes to typer's own coercion. None when this typer has no such hook (then nothing changes)."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:
        return None
    from dataclasses import dataclass
    plain = (str, str | None)

    @dataclass(frozen=True)
    class Quick(RuntimeParam):
        descriptor: object = None

        def coerce(self, value, param, ctx):
            if value is None or (isinstance(value, str) and self.annotation in plain):
                return super().coerce(value, param, ctx)
            return build_runtime_param(self.descriptor).coerce(value, param, ctx)

        def _coerce_value(self, value, param, ctx):
            return value

    def make(descriptor):
        return Quick(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation,
                     descriptor=descriptor)

    return make


def command():
    """The Click command behind `orchestra` (what `main` runs; tests invoke it too)."""
    built = typer.main.get_command(app)
    hide_flag_types(built, _quick_coercion())
    return built


def main() -> None:
    command()(prog_name="orchestra")
