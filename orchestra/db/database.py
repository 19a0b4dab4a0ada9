"""Open the async peewee database named by a URL (sqlite:///path or postgresql://...)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from playhouse.pwasyncio import AsyncPostgresqlDatabase, AsyncSqliteDatabase

from orchestra.db.models import database_proxy

SQLITE_PRAGMAS = {
    "journal_mode": "wal",
    "foreign_keys": 1,
    "synchronous": "normal",
    "busy_timeout": 10000,
}


async def release_connection(db) -> None:
    """Hand the current task's pooled connection back, unless a transaction holds it.

    playhouse.pwasyncio keeps a connection for the whole life of the task that first
    used it; Sanic runs every request of a keep-alive connection in one task, and a
    login waits seconds for argon2. Without this, nine idle keep-alive clients (or
    nine queued logins) exhaust the pool and every other query times out (500)."""
    if not db.in_transaction():
        await db.aclose()


class DatabaseUrlError(ValueError):
    """The database URL is not one orchestra can open."""


def connect(url: str, *, pool_size: int = 8):
    """Build (not yet connect) the async database for `url` and bind the models to it."""
    db = make_database(url, pool_size=pool_size)
    database_proxy.initialize(db)
    return db


def postgres_params(url: str) -> dict:
    """asyncpg connection keywords (database, host, port, user, password) from a URL."""
    parsed = urlparse(url)
    name = unquote(parsed.path.lstrip("/"))
    if not name:
        raise DatabaseUrlError("postgresql URL needs a database name: postgresql://host/db")
    params = {
        "database": name,
        "host": parsed.hostname or "127.0.0.1",
        "port": parsed.port or 5432,
        "user": unquote(parsed.username) if parsed.username else None,
        "password": unquote(parsed.password) if parsed.password else None,
    }
    return {k: v for k, v in params.items() if v is not None}


def make_database(url: str, *, pool_size: int = 8):
    parsed = urlparse(url)
    scheme = parsed.scheme.split("+")[0]
    if scheme == "sqlite":
        # As in SQLAlchemy and peewee: sqlite:///rel/path.db, sqlite:////abs/path.db.
        path = unquote(url.split("://", 1)[1])[1:].split("?", 1)[0]
        if not path:
            raise DatabaseUrlError("sqlite URL needs a file path: sqlite:////abs/path.db")
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        return AsyncSqliteDatabase(path, pragmas=SQLITE_PRAGMAS, pool_size=pool_size)
    if scheme in ("postgres", "postgresql"):
        params = postgres_params(url)
        return AsyncPostgresqlDatabase(params.pop("database"), pool_size=pool_size, **params)
    raise DatabaseUrlError(
        f"unsupported database URL {url!r}: use sqlite:///path/to/file.db or postgresql://host/db"
    )
