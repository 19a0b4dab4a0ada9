"""`orchestra serve`: run the HTTP server (migrations first, in this process)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import tempfile
from functools import partial

import typer

from orchestra.cli import console
from orchestra.cli.console import ExitCode, fail, handle_errors, run, say
from orchestra.cli.single_server import hold_sqlite_store
from orchestra.cli.store import check_home, describe_store, open_core, settings_from
from orchestra.settings import Settings


async def _prepare(settings: Settings) -> int:
    """Check the limiter settings and apply migrations, once, before any worker starts;
    count super administrators. Unfinished runs are not touched here: each server's
    engine claims those whose owner's lease has run out (see engine/store/ownership.py)."""
    from orchestra.services.auth import count_super_administrators  # here: `--help` stays quick
    from orchestra.web.limits import RateLimits

    RateLimits(settings)  # a bad limit or limiter storage is one error line now, not a dead worker
    async with open_core(settings) as core:
        return await count_super_administrators(core)


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def serve(
        ctx: typer.Context,
        host: str | None = typer.Option(None, "--host", help="Address to bind (ORCHESTRA_HOST, default 127.0.0.1)."),
        port: int | None = typer.Option(None, "--port", help="Port, 1-65535 (ORCHESTRA_PORT, default 8000)."),
        workers: int | None = typer.Option(None, "--workers", min=1, help="Worker processes (default 1)."),
        db: str | None = typer.Option(None, "--db", help="Database URL (overrides ORCHESTRA_DATABASE_URL)."),
        access_log: bool | None = typer.Option(None, "--access-log/--no-access-log", help="Log every request."),
    ) -> None:
        """Run the server (on the embedded SQLite store unless --db says otherwise)."""
        from sanic import Sanic
        from sanic.worker.loader import AppLoader

        from orchestra.web.protocol import OrchestraProtocol, raise_open_file_limit

        settings = settings_from(
            ctx, host=host, port=port, workers=workers, database_url=db, access_log=access_log
        )
        if settings.log_format == "json":  # from here on, every line written is a JSON object
            from orchestra.observability import logs

            logs.configure("json")
            console.JSON_MESSAGES = True
        check_address(settings.host, settings.port)  # one clear line now, not a worker's traceback
        check_home(settings)
        if settings.database_url.startswith("sqlite:"):  # any other URL is judged by _prepare
            hold_sqlite_store(settings)
        admins = run(_prepare(settings))
        if admins == 0:
            say("[yellow]No super administrator yet.[/] Make the first one with:\n"
                "  orchestra user create admin --role SUPER_ADMINISTRATOR\n"
                "or promote a registered user:  orchestra user promote <user_name>",
                "No super administrator yet. Make the first one with `orchestra user create admin "
                "--role SUPER_ADMINISTRATOR`, or promote a registered user with `orchestra user "
                "promote <user_name>`.", level=30)
        line = listening_banner(settings)
        from orchestra.engine.memory import tune_allocator

        tune_allocator()  # before the server starts its threads; see engine/memory.py
        from orchestra.engine.llm.factory import preload

        preload()  # the OpenAI-compatible client, before the first run needs it
        raise_open_file_limit()  # every connection is a file descriptor
        metrics_dir = shared_metrics_dir(settings)  # before any worker imports prometheus-client
        loader = AppLoader(factory=partial(serving_app, settings, line))
        app = loader.load()
        # Sanic's own "running in PRODUCTION mode, consider --debug or --dev" names flags
        # that `orchestra serve` does not have; the banner above says what to open instead.
        os.environ.setdefault("SANIC_IGNORE_PRODUCTION_WARNING", "1")
        app.prepare(
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            single_process=settings.workers == 1,
            access_log=settings.access_log,
            motd=False,
            protocol=OrchestraProtocol,  # the request-head deadline and limits
        )
        try:
            if settings.workers == 1:
                Sanic.serve_single(primary=app)
            else:
                Sanic.serve(primary=app, app_loader=loader)
        except OSError as exc:  # lost a race for the port after the check
            fail(bind_failure(settings.host, settings.port, exc), ExitCode.UNAVAILABLE)
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)


def shared_metrics_dir(settings: Settings) -> str | None:
    """Several workers share one port, so a scrape reaches any one of them: with metrics
    on, point them all at one fresh directory (prometheus-client's multiprocess mode),
    and whichever answers reports every worker's. The directory made here is removed at
    exit; one the operator names in PROMETHEUS_MULTIPROC_DIR is used as it is."""
    from orchestra.observability.metrics import MULTIPROCESS_ENV

    if not settings.metrics or settings.workers == 1 or os.environ.get(MULTIPROCESS_ENV):
        return None
    path = tempfile.mkdtemp(prefix="orchestra-metrics-")
    os.environ[MULTIPROCESS_ENV] = path
    return path


def listening_banner(settings: Settings) -> str:
    """What `serve` prints once bound: where it listens, the console and the API."""
    base = f"http://{settings.host}:{settings.port}"
    lines = [f"orchestra listening on {base} (store: {describe_store(settings.database_url)})"]
    if settings.console:
        lines.append(f"  web console  {base}/")
    lines.append(f"  API          {base}/api/v1 (browse it at {base}/api/v1/docs)")
    return "\n".join(lines)


def serving_app(settings: Settings, listening_line: str):
    """The app for `orchestra serve`: `create_app`, plus the "listening on …" line printed
    once the socket is bound (by the first worker only)."""
    from orchestra.observability import logs, metrics
    from orchestra.web.app import create_app

    app = create_app(settings, name="orchestra")
    logs.configure(settings.log_format)  # after the app: building it sets Sanic's loggers up

    async def log_format(_app) -> None:
        logs.configure(settings.log_format)  # and again in each worker process as it starts


    async def announce(_app) -> None:
        name = os.environ.get("SANIC_WORKER_NAME", "")
        if settings.workers == 1 or name.endswith("-0-0"):
            if settings.log_format == "json":
                logging.getLogger("orchestra.serve").info(
                    "; ".join(" ".join(part.split()) for part in listening_line.splitlines()))
            else:
                console.err.print(listening_line, highlight=False, markup=False)

    async def worker_gone(_app) -> None:
        metrics.process_exited(os.getpid())  # its live gauges leave the shared sums

    app.register_listener(log_format, "before_server_start")
    app.register_listener(announce, "after_server_start")
    app.register_listener(worker_gone, "after_server_stop")
    return app


def check_address(host: str, port: int) -> None:
    """Refuse a port out of range, a host that does not resolve, or an address already in
    use, with one line naming the flag and variable to change."""
    if not 1 <= port <= 65535:
        fail(f"port {port} is out of range: use 1-65535 (--port or ORCHESTRA_PORT)", ExitCode.USAGE)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        fail(f"cannot listen on host {host!r}: {reason} (--host or ORCHESTRA_HOST)", ExitCode.USAGE)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as exc:
            fail(bind_failure(host, port, exc), ExitCode.UNAVAILABLE)


def bind_failure(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot listen on {host}:{port}: the address is already in use (another server?); "
                f"choose another --port or ORCHESTRA_PORT")
    if exc.errno == errno.EACCES:
        return f"cannot listen on {host}:{port}: permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: {host} is not an address of this machine (--host or ORCHESTRA_HOST)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
