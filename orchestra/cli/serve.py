"""`orchestra serve`: run the HTTP server (migrations first, in this process)."""

from __future__ import annotations

from functools import partial
from typing import Optional

import typer

from orchestra.cli.console import err, handle_errors, run
from orchestra.cli.single_server import hold_sqlite_store
from orchestra.cli.store import open_core, settings_from
from orchestra.services.auth import count_super_administrators
from orchestra.settings import Settings


async def _prepare(settings: Settings) -> int:
    """Check the limiter settings and apply migrations, once, before any worker starts;
    count super administrators. Unfinished runs are not touched here: each server's
    engine claims those whose owner's lease has run out (see engine/ownership.py)."""
    from orchestra.web.limits import RateLimits

    RateLimits(settings)  # a bad limit or limiter storage is one error line now, not a dead worker
    async with open_core(settings) as core:
        return await count_super_administrators(core)


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def serve(
        ctx: typer.Context,
        host: Optional[str] = typer.Option(None, "--host", help="Address to bind (ORCHESTRA_HOST, default 127.0.0.1)."),
        port: Optional[int] = typer.Option(None, "--port", help="Port (ORCHESTRA_PORT, default 8000)."),
        workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Worker processes (default 1)."),
        db: Optional[str] = typer.Option(None, "--db", help="Database URL (overrides ORCHESTRA_DATABASE_URL)."),
        access_log: Optional[bool] = typer.Option(None, "--access-log/--no-access-log", help="Log every request."),
    ) -> None:
        """Run the server (on the embedded SQLite store unless --db says otherwise)."""
        from sanic import Sanic
        from sanic.worker.loader import AppLoader

        from orchestra.web.app import create_app
        from orchestra.web.protocol import OrchestraProtocol, raise_open_file_limit

        settings = settings_from(
            ctx, host=host, port=port, workers=workers, database_url=db, access_log=access_log
        )
        if not settings.database_url.startswith(("postgres://", "postgresql://")):
            hold_sqlite_store(settings)
        admins = run(_prepare(settings))
        if admins == 0:
            err.print(
                "[yellow]No super administrator yet.[/] Make the first one with:\n"
                "  orchestra user create admin --role SUPER_ADMINISTRATOR\n"
                "or promote a registered user:  orchestra user promote <user_name>",
                highlight=False,
            )
        err.print(
            f"orchestra listening on http://{settings.host}:{settings.port}/api/v1 "
            f"(store: {_describe(settings.database_url)})",
            highlight=False,
        )
        from orchestra.engine.memory import tune_allocator

        tune_allocator()  # before the server starts its threads; see engine/memory.py
        raise_open_file_limit()  # every connection is a file descriptor
        loader = AppLoader(factory=partial(create_app, settings, name="orchestra"))
        app = loader.load()
        app.prepare(
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            single_process=settings.workers == 1,
            access_log=settings.access_log,
            motd=False,
            protocol=OrchestraProtocol,  # the request-head deadline and limits
        )
        if settings.workers == 1:
            Sanic.serve_single(primary=app)
        else:
            Sanic.serve(primary=app, app_loader=loader)


def _describe(url: str) -> str:
    """The database URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':')[0]}@{host}"
    return url
