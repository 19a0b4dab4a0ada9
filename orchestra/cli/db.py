"""`orchestra db upgrade | status | prune | backup`: migrations, retention by hand, copies."""

from __future__ import annotations

import typer

from orchestra.cli.console import handle_errors, out, print_json, run, success
from orchestra.cli.store import settings_from

app = typer.Typer(
    help="The store itself: schema migrations, pruning old runs, backups — straight against "
         "the store (no server needed; the server also applies migrations at start). "
         "Use --home/--db to pick the store.",
    no_args_is_help=True,
)


async def _with_db(settings, action):
    from orchestra.db.database import connect

    settings.ensure_home()
    db = connect(settings.database_url, busy_timeout=settings.db_busy_timeout)
    try:
        return await action(db)
    finally:
        await db.close_pool()


@app.command()
@handle_errors
def upgrade(ctx: typer.Context) -> None:
    """Apply every pending migration."""
    from orchestra.db import migrate

    settings = settings_from(ctx)
    applied = run(_with_db(settings, migrate.upgrade))
    if applied:
        success(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        success("the schema is up to date")


@app.command()
@handle_errors
def status(ctx: typer.Context, json_output: bool = typer.Option(False, "--json")) -> None:
    """Show each migration and when it was applied."""
    from orchestra.db import migrate

    settings = settings_from(ctx)
    rows = run(_with_db(settings, migrate.status))
    if json_output:
        print_json([{"name": r.name, "applied_at": r.applied_at.isoformat() if r.applied_at else None} for r in rows])
        return
    from rich.table import Table

    table = Table("migration", "applied")
    for r in rows:
        table.add_row(r.name, r.applied_at.isoformat(sep=" ", timespec="seconds") if r.applied_at else "pending")
    out.print(table)


@app.command()
@handle_errors
def prune(
    ctx: typer.Context,
    older_than: str = typer.Option(..., "--older-than", metavar="AGE",
                                   help="Delete runs that ended longer ago than this: 30d, 12h, 90m (0d: every ended run)."),
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """Delete ended runs (with their steps and events) and expired refresh tokens, now.

    Runs still going (queued, running, waiting for a reply) are never touched. The server
    does the same hourly when ORCHESTRA_RUN_RETENTION_DAYS is set."""
    from orchestra.cli.console import ExitCode, fail
    from orchestra.cli.store import open_core
    from orchestra.services import retention

    try:
        age = retention.parse_age(older_than)
    except ValueError as exc:
        fail(f"--older-than: {exc}", ExitCode.USAGE)

    async def go():
        async with open_core(settings_from(ctx)) as core:
            return await retention.prune(core, older_than=age)

    done = run(go())
    if done.skipped:
        fail("another process is pruning this store right now; try again later", ExitCode.UNAVAILABLE)
    if json_output:
        print_json({"runs": done.runs, "refresh_tokens": done.tokens})
        return
    success(f"deleted {done.runs} run(s) that ended more than {older_than.strip()} ago "
            f"and {done.tokens} expired refresh token(s)")


@app.command()
@handle_errors
def backup(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="The new file to write (it must not exist)."),
) -> None:
    """Copy the SQLite store to PATH, consistently, even while the server runs."""
    from pathlib import Path

    from orchestra.cli.console import ExitCode, fail
    from orchestra.db.backup import BackupError, backup_sqlite
    from orchestra.db.database import is_postgres_url, sqlite_path

    settings = settings_from(ctx)
    url = settings.database_url
    if is_postgres_url(url):
        fail("orchestra db backup copies a SQLite store; for PostgreSQL use its own tools, "
             "e.g. pg_dump --format=custom --file=orchestra.dump DATABASE_URL", ExitCode.USAGE)
    try:
        size = backup_sqlite(Path(sqlite_path(url)), Path(path).expanduser().absolute(),
                             busy_timeout_ms=max(1, round(settings.db_busy_timeout * 1000)))
    except BackupError as exc:
        fail(str(exc), ExitCode.USAGE)
    success(f"copied the store to {path} ({size} bytes)")
