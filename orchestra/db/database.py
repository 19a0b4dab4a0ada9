"""Open the async peewee database named by a URL (sqlite:///path or postgresql://...)."""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from peewee import OperationalError, __exception_wrapper__
from playhouse.pwasyncio import (
    AsyncPostgresqlConnection,
    AsyncPostgresqlDatabase,
    AsyncSqliteConnection,
    AsyncSqliteDatabase,
    AsyncSqlitePool,
    CursorAdapter,
)

from orchestra.db.models import database_proxy

logger = logging.getLogger("orchestra.db")

SQLITE_PRAGMAS = {
    "journal_mode": "wal",
    "foreign_keys": 1,
    "synchronous": "normal",
    "busy_timeout": 10000,  # ms; ORCHESTRA_DB_BUSY_TIMEOUT (seconds) sets it: `connect`
}


async def release_connection(db) -> None:
    """Hand the current task's pooled connection back, unless a transaction holds it.

    playhouse.pwasyncio keeps a connection for the whole life of the task that first
    used it; Sanic runs every request of a keep-alive connection in one task, and a
    login waits seconds for argon2. Without this, nine idle keep-alive clients (or
    nine queued logins) exhaust the pool and every other query times out (500).

    Runs up to three times a request (after the role check, before the response, at
    its end), mostly for a task that holds nothing: that case costs one look-up."""
    state = _task_state(db)
    if state is not None and state.conn is None:
        return  # nothing held (a request served from in-process copies)
    if not db.in_transaction():
        await db.aclose()


def _task_state(db):
    """playhouse.pwasyncio's state of the current task (its `conn` and `transactions`)
    in one look-up, or None on a database without one. The public path (`in_transaction`,
    then `aclose`) looks the task up three times to find that nothing is held."""
    current = getattr(getattr(db, "_state", None), "_current", None)
    return current() if current is not None else None


async def end_task_store_work(db) -> None:
    """At the end of a request, whatever happened in it (an exception, a cancellation, a
    streamed response): forget any transaction it left open and hand its connection back.

    The pool rolls the connection back before anyone else gets it (see
    `SettlingSqliteDatabase` for a statement still running in SQLite's thread).
    Nothing can legitimately still be inside a transaction here: the request is over."""
    try:
        state = _task_state(db)
        if state is not None and state.conn is None and not state.transactions:
            return  # nothing held, nothing left open
        leaked = db.transaction_depth()
        if leaked:
            logger.warning("a request ended inside %d open transaction(s); rolling back", leaked)
            while db.transaction_depth():
                db.pop_transaction()
            db._clear_commit_callbacks()
        await db.aclose()
    except Exception:  # the pool may be closing at shutdown
        logger.warning("could not release a request's store connection", exc_info=True)


_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


def _needs_turn(sql: str) -> bool:
    """Whether `sql` takes SQLite's write lock: a `BEGIN IMMEDIATE`/`EXCLUSIVE`, or a
    write (by itself, or the first in a deferred transaction). A deferred `BEGIN`, a read,
    `COMMIT` and `ROLLBACK` take none."""
    head = sql.lstrip()[:16].upper()
    if head.startswith("BEGIN"):
        return "IMMEDIATE" in head or "EXCLUSIVE" in head
    return head.startswith(_WRITES)


class WriteTurns:
    """This process's writers to one SQLite file, one at a time, first come first served.

    SQLite lets one connection write at a time; the others sleep in its busy handler and
    retry (1, 2, 5 … 100 ms apart), so under many writers each one's wait grows to
    seconds while it holds a pooled connection, and every other request (reads too)
    waits for a connection behind them: a user starting 20 runs at once made another
    user's reads wait 0.5 s (benchmarks/bench_hostile.py). Writers of this process take
    a turn here before they ask SQLite for the lock, so they wait in order, hand the lock
    on at once, and the lock's own wait is left for other processes (the CLI). A turn not
    had within the busy timeout fails as SQLite's own wait would ("database is locked")."""

    def __init__(self, wait_seconds: float) -> None:
        self._lock = asyncio.Lock()
        self.wait_seconds = wait_seconds

    async def take(self) -> None:
        try:
            async with asyncio.timeout(self.wait_seconds):
                await self._lock.acquire()
        except TimeoutError:
            raise sqlite3.OperationalError("database is locked") from None

    def give_back(self) -> None:
        self._lock.release()


class _SettlingConnection(AsyncSqliteConnection):
    """Remembers that a statement was interrupted (its task cancelled) while it ran, and
    holds its process's write turn (`WriteTurns`) from its first write to the end of the
    transaction, or for the one statement that writes by itself."""

    interrupted = False
    turns: WriteTurns | None = None
    has_turn = False

    async def execute(self, sql, params=None):
        if self.turns is not None and not self.has_turn and _needs_turn(sql):
            await self.turns.take()
            self.has_turn = True
        try:
            return await super().execute(sql, params)
        except asyncio.CancelledError:
            self.interrupted = True  # the statement still runs: the pool's release settles it
            raise
        finally:
            if not self.interrupted and not self.conn.in_transaction:
                self.give_back_turn()

    def give_back_turn(self) -> None:
        if self.has_turn:
            self.has_turn = False
            self.turns.give_back()


class _SettlingPool(AsyncSqlitePool):
    """aiosqlite runs each statement in the connection's own thread, and cancelling the
    awaiting task does not stop it. A request cancelled while its `BEGIN IMMEDIATE`
    waited for the write lock (a client hanging up) used to hand its connection back at
    once; the BEGIN then succeeded behind the pool's back, and that idle connection held
    the write lock: every other writer got "database is locked" until it happened to be
    reused. Here an interrupted connection first waits for its statement to finish, so
    the release then sees the open transaction and rolls it back; only then does its
    write turn pass on."""

    def __init__(self, database, *, turns: WriteTurns, **kwargs) -> None:
        super().__init__(database, **kwargs)
        self.turns = turns

    async def _create_connection(self):
        plain = await super()._create_connection()
        settling = _SettlingConnection(plain.conn)
        settling.turns = self.turns
        return settling

    async def release(self, conn):
        try:
            if getattr(conn, "interrupted", False) and not self._closed and not conn.stale():
                conn.interrupted = False
                try:  # queued behind the interrupted statement in the connection's thread
                    await (await conn.conn.execute("SELECT 1")).close()
                except Exception:  # the rollback below decides; a broken one is replaced
                    logger.warning("an interrupted store connection did not settle", exc_info=True)
            await super().release(conn)
        finally:
            conn.interrupted = False
            conn.give_back_turn()


READERS = 8  # connections a SQLite store keeps for reads made outside any task's connection


class SettlingSqliteDatabase(AsyncSqliteDatabase):
    """`AsyncSqliteDatabase` whose pool never hands out a connection that a cancelled
    statement may still put in a transaction (see `_SettlingPool`), whose writers take
    turns (`WriteTurns`) rather than poll for SQLite's lock, and whose reads never wait
    behind writers: a read by a task that holds no connection (an authenticated list,
    a page of events) runs on a reader of its own (`PRAGMA query_only`), handed back at
    once, so writers holding every pooled connection while they wait their turn never
    make another user's read wait for one. What a task wrote and committed, its later
    reads see (WAL: a reader sees every commit before it began); inside a transaction, or
    once the task holds a connection, its reads go where its writes do."""

    _readers: AsyncSqlitePool | None = None

    async def _create_pool_async(self):
        busy_ms = dict(self._pragmas or ()).get("busy_timeout", SQLITE_PRAGMAS["busy_timeout"])
        pool = _SettlingPool(
            self.database,
            turns=WriteTurns(int(busy_ms) / 1000),
            pool_size=1 if self.database == ":memory:" else self._pool_size,
            on_connect=self._add_conn_hooks,
            timeout=self._timeout,
            **self.connect_params,
        )
        await pool.initialize()
        if self.database != ":memory:":  # another connection to :memory: is another database
            self._readers = await AsyncSqlitePool(
                self.database, pool_size=READERS, on_connect=self._add_reader_hooks,
                timeout=self._timeout, **self.connect_params).initialize()
        return pool

    async def _add_reader_hooks(self, conn) -> None:
        await self._add_conn_hooks(conn)
        await (await conn.execute("PRAGMA query_only = 1")).close()

    async def aexecute_sql(self, sql, params=None):
        readers = self._readers
        if readers is None or self._state.conn is not None or not _is_read(sql):
            return await super().aexecute_sql(sql, params)
        self._log_query(sql, params)
        start = time.perf_counter() if self.query_hooks else None  # as peewee's own path
        try:
            try:
                conn = await asyncio.wait_for(readers.acquire(), timeout=self._acquire_timeout)
            except TimeoutError:  # worded as the pool's own: db/outage.py reads it as the store out
                raise OperationalError("Timed out acquiring connection from the readers "
                                       f"(acquire_timeout={self._acquire_timeout}).") from None
            try:
                with __exception_wrapper__:
                    result = await conn.execute(sql, params)
            finally:
                await readers.release(conn)
        except Exception as exc:
            if start is not None:
                self._notify_hooks(sql, params, start, exc)
            raise
        if start is not None:
            self._notify_hooks(sql, params, start, None)
        return result

    async def _pool_close(self):
        readers, self._readers = self._readers, None
        try:
            await super()._pool_close()
        finally:
            if readers is not None:
                await readers.close()


def _is_read(sql: str) -> bool:
    return sql.lstrip()[:6].upper() == "SELECT"


async def _keep_session(conn) -> None:
    """asyncpg's pool resets every connection it gets back (`pg_advisory_unlock_all(); CLOSE
    ALL; UNLISTEN *; RESET ALL`): a round trip, and a transaction of its own, on each of the
    thousands of releases a busy process makes (a run's writer gives its connection back
    after every write). Our pooled connections keep no session state — no session advisory
    locks, cursors, LISTEN or SET (LISTEN has a connection of its own; an open transaction
    is rolled back by the pool before this) — so there is nothing to reset."""


#: A statement that gives rows back (read with `fetch`); any other is run with `execute`,
#: whose command status gives the row count.
_GIVES_ROWS = re.compile(r"^\s*\(?\s*(SELECT|WITH|VALUES|SHOW|TABLE|EXPLAIN)\b|\bRETURNING\b",
                         re.IGNORECASE)


class _CachedStatementConnection(AsyncPostgresqlConnection):
    """playhouse.pwasyncio prepares every statement afresh (`Connection.prepare` skips
    asyncpg's statement cache): a Parse round trip before each Bind/Execute, outside a
    transaction an implicit transaction of its own, and a Close for the statement later.
    Here a statement runs through asyncpg's public `fetch` or `execute`, which keep each
    connection's statements prepared (an LRU of 100) and prepare again by themselves
    when a migration changed a table under a cached statement outside a transaction."""

    async def _execute(self, sql, params=None):
        if params:
            sql = self._translate_placeholders(sql)
        args = params or ()
        if _GIVES_ROWS.search(sql):
            records = await self.conn.fetch(sql, *args)
            # an asyncpg Record iterates over its values; .keys() are the column names
            description = [(k,) for k in records[0].keys()] if records else []  # noqa: SIM118
            return CursorAdapter(records, rowcount=len(records), description=description)
        status = await self.conn.execute(sql, *args)
        # The command status tail: "UPDATE 3", "DELETE 2", "INSERT 0 3".
        tail = (status or "").rsplit(" ", 1)
        rowcount = int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else 0
        return CursorAdapter([], rowcount=rowcount, description=[])


class CachedStatementPostgresqlDatabase(AsyncPostgresqlDatabase):
    """`AsyncPostgresqlDatabase` whose connections reuse prepared statements (see
    `_CachedStatementConnection`): half the round trips per statement, and no transaction
    spent on preparing one."""

    async def _pool_acquire(self, pool):
        conn = await asyncio.wait_for(pool.acquire(), timeout=self._acquire_timeout)
        return _CachedStatementConnection(conn)


def is_postgres_url(url: str) -> bool:
    """Whether `url` names a PostgreSQL store (`postgres://` or `postgresql://`)."""
    return url.startswith(("postgres://", "postgresql://"))


class DatabaseUrlError(ValueError):
    """The database URL is not one orchestra can open."""


def connect(url: str, *, pool_size: int = 8, busy_timeout: float | None = None,
            idle_transaction_timeout: float | None = None):
    """Build (not yet connect) the async database for `url` and bind the models to it;
    `busy_timeout`: seconds a SQLite statement waits on a lock (SQLITE_PRAGMAS' otherwise);
    `idle_transaction_timeout`: see `make_database`."""
    db = make_database(url, pool_size=pool_size, busy_timeout=busy_timeout,
                       idle_transaction_timeout=idle_transaction_timeout)
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


def sqlite_path(url: str) -> str:
    """The file of a sqlite:// URL (as in SQLAlchemy and peewee: sqlite:///rel/path.db,
    sqlite:////abs/path.db)."""
    path = unquote(url.split("://", 1)[1])[1:].split("?", 1)[0]
    if not path:
        raise DatabaseUrlError("sqlite URL needs a file path: sqlite:////abs/path.db")
    return path


def make_database(url: str, *, pool_size: int = 8, busy_timeout: float | None = None,
                  idle_transaction_timeout: float | None = None):
    """The async database for `url`. On PostgreSQL, `idle_transaction_timeout` (seconds) has
    the server end a session left idle inside a transaction that long: a process frozen
    (SIGSTOP, a VM paused) while it held a transaction would otherwise keep its row locks
    for as long as it is frozen, and the process taking its runs over would wait on them."""
    parsed = urlparse(url)
    scheme = parsed.scheme.split("+")[0]
    if scheme == "sqlite":
        path = sqlite_path(url)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        pragmas = SQLITE_PRAGMAS if busy_timeout is None else \
            {**SQLITE_PRAGMAS, "busy_timeout": max(1, round(busy_timeout * 1000))}
        return SettlingSqliteDatabase(path, pragmas=pragmas, pool_size=pool_size)
    if scheme in ("postgres", "postgresql"):
        params = postgres_params(url)
        if idle_transaction_timeout:
            params["server_settings"] = {
                "idle_in_transaction_session_timeout": str(max(1, round(idle_transaction_timeout * 1000)))}
        return CachedStatementPostgresqlDatabase(params.pop("database"), pool_size=pool_size,
                                       reset=_keep_session, **params)
    raise DatabaseUrlError(
        f"unsupported database URL {url!r}: use sqlite:///path/to/file.db or postgresql://host/db"
    )
