"""Opening the store for one CLI command: settings from env + root options, and the
errors of opening it (home folder, driver, database server) as one readable line."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import typer

from orchestra.cli.console import ExitCode, fail
from orchestra.settings import Settings

if TYPE_CHECKING:
    from orchestra.core import Core


def settings_from(ctx: typer.Context, **overrides) -> Settings:
    """Settings from ORCHESTRA_* variables, then the root options, then `overrides`."""
    root = (ctx.find_root().obj or {}) if ctx else {}
    merged = {k: v for k, v in root.items() if v is not None}
    merged.update({k: v for k, v in overrides.items() if v is not None})  # unset flags hide nothing
    return Settings.from_env(**merged)


def check_home(settings: Settings) -> None:
    """The home folder exists and holds the secret key, or one line naming ORCHESTRA_HOME."""
    try:
        settings.ensure_home()
        settings.load_secret_key()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(settings.home) else ""
        fail(f"cannot use the home folder {settings.home}{where}: {reason}; "
             f"set ORCHESTRA_HOME (or --home) to a folder you may write", ExitCode.ERROR)


def describe_store(url: str) -> str:
    """The database URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':')[0]}@{host}"
    return url


def store_open_failure(settings: Settings, exc: BaseException) -> str | None:
    """One line for a store that cannot be opened (missing driver, server not reachable),
    or None when `exc` is something else."""
    from orchestra.db.database import is_postgres_url

    url = settings.database_url
    if not is_postgres_url(url):
        return None
    text = str(exc)
    if isinstance(exc, ImportError) or "asyncpg is not installed" in text:
        return ("PostgreSQL needs the asyncpg driver, which is not installed: "
                "pip install 'orchestra[postgres]' (the postgres extra)")
    parsed = urlparse(url)
    where = f"{parsed.hostname or '127.0.0.1'}:{parsed.port or 5432}"
    if isinstance(exc, socket.gaierror):
        reason = f"unknown host {parsed.hostname!r}"
    elif isinstance(exc, ConnectionRefusedError):
        reason = "connection refused (is PostgreSQL running there?)"
    elif isinstance(exc, TimeoutError):
        reason = "no answer in time"
    elif isinstance(exc, OSError):
        reason = exc.strerror or text
    else:
        return None
    return f"cannot connect to PostgreSQL at {where}: {reason}; check ORCHESTRA_DATABASE_URL (or --db)"


@asynccontextmanager
async def open_core(settings: Settings) -> AsyncIterator[Core]:
    """The store and services for one command (imported here: `--help` needs none of it)."""
    from orchestra.core import Core

    check_home(settings)
    try:
        core = await Core.open(settings)
    except Exception as exc:
        line = store_open_failure(settings, exc) or store_open_failure(settings, exc.__cause__ or exc)
        if line:
            fail(line, ExitCode.UNAVAILABLE)
        raise
    try:
        yield core
    finally:
        await core.close()
