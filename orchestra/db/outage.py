"""Store outages: which errors mean "the store cannot be reached", and how a process
reports an outage in its log (one line when it starts, at most one per 10 s while it
lasts, one with its length when it ends — never a traceback per request).

One place decides what an outage is (`is_unreachable`), so the engine (wait and retry,
never fail a run), the web layer (503 `StoreUnavailableError` with `Retry-After`) and
the logs all agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time

from orchestra.backoff import Backoff

logger = logging.getLogger("orchestra.store")

REPORT_EVERY_SECONDS = 10.0  # at most one "still unreachable" line per this many seconds
RETRY_AFTER_SECONDS = 2  # what a 503 asks a client to wait

_TEXT = (
    "connection refused", "connection reset", "connection was closed", "connection is closed",
    "connection lost", "cannot connect", "could not connect", "the database system is",
    "terminating connection", "server closed the connection", "timed out acquiring connection",
    "no route to host", "broken pipe", "connection does not exist", "pool is closed",
    "pool is closing", "underlying connection is closed", "database is locked",
    "database is busy", "database table is locked", "network is unreachable",
)


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` (or its cause) says the store could not be reached or is restarting,
    rather than that a statement was wrong: refused and reset connections, a server
    shutting down or starting, a pool acquire that timed out, SQLite locked/busy, a
    cached statement outdated by another process's migration."""
    seen = 0
    while exc is not None and seen < 5:
        seen += 1
        if isinstance(exc, (ConnectionError, TimeoutError, OSError)) and not isinstance(
                exc, FileNotFoundError):
            return True
        name = type(exc).__name__
        module = type(exc).__module__ or ""
        if module.startswith("asyncpg") and name in (
            "CannotConnectNowError", "ConnectionDoesNotExistError", "InterfaceError",
            "AdminShutdownError", "CrashShutdownError", "ConnectionFailureError",
            "TooManyConnectionsError", "InternalClientError", "PostgresConnectionError",
            "ClientCannotConnectError", "ConnectionRejectionError",
            # A migration (a rolling upgrade's new version) changed a table under a
            # prepared statement this connection cached: asyncpg has dropped its caches,
            # and the same work tried again prepares afresh.
            "InvalidCachedStatementError", "OutdatedSchemaCacheError",
        ):
            return True
        if isinstance(exc, sqlite3.OperationalError) or name == "OperationalError":
            text = str(exc).lower()
            if "locked" in text or "busy" in text or "unable to open" in text:
                return True
        text = str(exc).lower()
        if any(part in text for part in _TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _QuietOutages(logging.Filter):
    """Drops a driver's own traceback for an outage (asyncpg's pool logs one each time
    it fails to reconnect); the outage is reported by `StoreOutage` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not is_unreachable(exc)


def quiet_driver_logs() -> None:
    """Install the filter on the store drivers' loggers (idempotent)."""
    for name in ("asyncpg", "asyncpg.pool"):
        driver = logging.getLogger(name)
        if not any(isinstance(f, _QuietOutages) for f in driver.filters):
            driver.addFilter(_QuietOutages())


class StoreOutage:
    """This process's view of the store: reachable, or unreachable since when. Reports
    an outage in at most a few log lines, whoever (engine, requests) runs into it."""

    def __init__(self) -> None:
        quiet_driver_logs()
        self.down_since: float | None = None  # monotonic
        self.last_seen_down: float | None = None
        self._reported_at = 0.0
        self._failures = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def recently_down(self, within: float) -> bool:
        """Whether the store was unreachable from here within the last `within` seconds."""
        return self.last_seen_down is not None and time.monotonic() - self.last_seen_down < within

    def failed(self, exc: BaseException, what: str = "") -> bool:
        """Note a failure; True when it is an outage (then it is logged, rate-limited),
        False for any other error (the caller reports it as it sees fit)."""
        if not is_unreachable(exc):
            return False
        now = time.monotonic()
        self.last_seen_down = now
        self._failures += 1
        if self.down_since is None:
            self.down_since = self._reported_at = now
            logger.warning("the store is unreachable (%s%s: %s); waiting for it",
                           f"{what}, " if what else "", type(exc).__name__, _short(exc))
        elif now - self._reported_at >= REPORT_EVERY_SECONDS:
            self._reported_at = now
            logger.warning("the store is still unreachable after %.0f s (%d failed calls)",
                           now - self.down_since, self._failures)
        return True

    def succeeded(self) -> None:
        """Note that a call reached the store; ends an outage (logged with its length)."""
        if self.down_since is not None:
            length = time.monotonic() - self.down_since
            self.down_since = None
            logger.warning("the store is reachable again after %.1f s (%d failed calls)",
                           length, self._failures)
            self._failures = 0


STORE_RETRY = Backoff(base=0.2, cap=5.0)  # a statement or a round tried again while the store is down


async def sleep_backoff(attempt: int) -> None:
    """Wait before the `attempt`-th retry (1, 2, …) of something the store refused."""
    await STORE_RETRY.sleep(attempt)


async def release_quietly(db) -> None:
    """Give the current task's connection back, if the store lets us (during an outage
    the pool replaces a broken one on its next use)."""
    from orchestra.db.database import release_connection

    try:
        await release_connection(db)
    except Exception:  # noqa: BLE001 - the connection went away with the store
        logger.debug("could not release a store connection", exc_info=True)


async def keep_going(one_round, *, what: str, db, outage: StoreOutage, wake: asyncio.Event,
                     stopping) -> None:
    """Run `one_round()` (it answers the seconds to wait before the next) until `stopping()`:
    a failed round backs off and is logged once per outage, the task's connection is given
    back after every round, and `wake` cuts a wait short. The shape every background loop
    of a process shares (schedule fires, webhook deliveries)."""
    failures = 0
    while not stopping():
        wake.clear()
        try:
            wait = await one_round()
            outage.succeeded()
            failures = 0
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any one round
            failures += 1
            if not outage.failed(exc, what):
                logger.exception("%s failed", what)
            wait = STORE_RETRY.delay(failures)
        finally:
            await release_quietly(db)
        if stopping():
            break
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await wake.wait()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text[:160]
