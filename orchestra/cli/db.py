"""`orchestra db upgrade | status`: schema migrations."""

from __future__ import annotations

import typer

from orchestra.cli.console import handle_errors, out, print_json, run, success
from orchestra.cli.store import settings_from

app = typer.Typer(
    help="Schema migrations, straight against the store (no server needed; the server also "
         "applies them at start). Use --home/--db to pick the store.",
    no_args_is_help=True,
)


async def _with_db(settings, action):
    from orchestra.db.database import connect

    settings.ensure_home()
    db = connect(settings.database_url)
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
