"""Cross-process hints: PostgreSQL `LISTEN`/`NOTIFY` on one dedicated connection per
process, or an in-process bus on the embedded SQLite store (one process).

A signal is a hint, never the data: whoever receives one reads the store. Channels:
- `events`: `<trace_id>:<seq>`, sent by a trigger when events are stored;
- `cache`: a table name (`user`, `provider`, `worker`, `skill`, `system_node`), sent by
  triggers on every change, or `agents` for an explicit reload, or `workflow_schedule`
  (sent by the schedules service on every save: the fire loops read the next due time);
- `control`: `<verb>:<trace_id>`, sent by the application — `wake` (a run is queued or
  handed back), `reply` and `cancel` (for the run's owner).

When the listening connection is lost, every `on_resync` handler runs once it is back,
so that what was missed meanwhile is read again from the store; `connected` is False
in between, and caches must not trust their copies then. It is also False while the
listening socket holds bytes this process has not read yet (a signal on its way in, or
the news that the connection is gone): a request served in that moment reads the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from orchestra.backoff import Backoff

logger = logging.getLogger("orchestra.signals")

CHANNELS = {"events": "orchestra_events", "cache": "orchestra_cache", "control": "orchestra_control"}
LISTENER_NAME = "orchestra-listen"  # application_name of the LISTEN connection
HEALTH_CHECK_SECONDS = 2.0
RECONNECT_MAX_SECONDS = 5.0
RECONNECT = Backoff(base=0.1, cap=RECONNECT_MAX_SECONDS)  # the LISTEN connection's retries

Handler = Callable[[str], None]


class Signals:
    """The in-process bus; `PostgresSignals` carries the same calls across processes."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[Handler]] = defaultdict(list)
        self._resync: list[Callable[[], None]] = []
        self._up = True
        self.generation = 1  # grows on every (re)connection: copies of older ones are stale

    @property
    def connected(self) -> bool:
        """Whether every signal sent so far has been handled here (copies may be trusted)."""
        return self._up

    def on(self, channel: str, handler: Handler) -> None:
        """Call `handler(payload)` (on the event loop, never awaited) for each signal."""
        if channel not in CHANNELS:
            raise ValueError(f"unknown signal channel {channel!r}")
        self._handlers[channel].append(handler)

    def on_resync(self, handler: Callable[[], None]) -> None:
        """Call `handler()` after a reconnection: signals may have been missed."""
        self._resync.append(handler)

    async def start(self) -> None:
        """Begin listening (nothing to do in-process)."""

    async def stop(self) -> None:
        """Stop listening."""

    async def notify(self, channel: str, payload: str) -> None:
        """Send a signal to every process (this one included)."""
        asyncio.get_running_loop().call_soon(self._dispatch, channel, payload)

    def _dispatch(self, channel: str, payload: str) -> None:
        for handler in list(self._handlers.get(channel, ())):
            try:
                handler(payload)
            except Exception:  # noqa: BLE001 - one bad handler must not stop the others
                logger.exception("signal handler for %s failed", channel)

    def _resynced(self) -> None:
        for handler in list(self._resync):
            try:
                handler()
            except Exception:  # noqa: BLE001
                logger.exception("resync handler failed")


class PostgresSignals(Signals):
    """LISTEN on one dedicated asyncpg connection (not from the pool); reconnects with
    backoff after losing it, then runs the resync handlers."""

    def __init__(self, connect_params: dict[str, Any]) -> None:
        super().__init__()
        self._params = connect_params
        self._conn: Any = None
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._ready = asyncio.Event()
        self._peek: socket.socket | None = None  # the LISTEN socket, to look for unread bytes
        self._up = False
        self.generation = 0

    @property
    def connected(self) -> bool:
        """Up, and nothing unread on the LISTEN socket: a NOTIFY (or the server's goodbye)
        that has reached this machine but not yet the event loop makes copies untrusted
        until it is handled, so "at once on every process" holds for a request the loop
        serves first. One non-blocking peek, a microsecond."""
        if not self._up:
            return False
        peek = self._peek
        if peek is None:
            return True
        try:
            peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True  # nothing waiting
        except OSError:
            return False
        return False  # bytes waiting, or b"" (the server closed it)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen(), name="pg-listen")
            try:
                async with asyncio.timeout(10):
                    await self._ready.wait()
            except TimeoutError:
                logger.warning("the LISTEN connection is not up yet; retrying in the background")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._close()

    async def notify(self, channel: str, payload: str) -> None:
        """NOTIFY through the listening connection (no pooled connection is taken);
        while it is down, through a short-lived one."""
        import asyncpg

        name = CHANNELS[channel]
        conn = self._conn
        if conn is not None and not conn.is_closed():
            try:
                async with self._lock:
                    await conn.execute("SELECT pg_notify($1, $2)", name, payload)
                return
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
                pass
        other = await asyncpg.connect(**self._params, timeout=5)
        try:
            await other.execute("SELECT pg_notify($1, $2)", name, payload)
        finally:
            await other.close()

    async def _listen(self) -> None:
        import asyncpg

        failures = 0
        lost_at: float | None = None  # when the connection went; one line then, one when back
        while True:
            try:
                conn = await asyncpg.connect(
                    **self._params, timeout=5, server_settings={"application_name": LISTENER_NAME}
                )
                lost = asyncio.get_running_loop().create_future()
                conn.add_termination_listener(lambda _c, lost=lost: lost.done() or lost.set_result(None))
                for channel, name in CHANNELS.items():
                    await conn.add_listener(name, self._listener(channel))
                self._conn, self._up = conn, True
                self._peek = _duplicate_socket(conn)
                self.generation += 1
                self._ready.set()
                failures = 0
                if lost_at is not None:
                    logger.warning("LISTEN connection back after %.1f s",
                                   asyncio.get_running_loop().time() - lost_at)
                    lost_at = None
                self._resynced()
                await self._watch(conn, lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                # An outage retries every few seconds: a line when it starts, not per try.
                if lost_at is None:
                    lost_at = asyncio.get_running_loop().time()
                    logger.warning("LISTEN connection lost (%s); reconnecting", exc)
                else:
                    logger.debug("LISTEN connection still down (%s)", exc)
            else:
                lost_at = asyncio.get_running_loop().time()
                logger.warning("LISTEN connection lost; reconnecting")
            self._up = False
            await self._close()
            failures += 1
            await RECONNECT.sleep(failures)

    async def _watch(self, conn: Any, lost: asyncio.Future) -> None:
        """Return when the connection is gone: its termination, or a failed health check
        (a server-side kill may only show on the next query)."""
        while not lost.done():
            try:
                async with asyncio.timeout(HEALTH_CHECK_SECONDS):
                    await asyncio.shield(lost)
                return
            except TimeoutError:
                pass
            async with self._lock, asyncio.timeout(HEALTH_CHECK_SECONDS * 2):
                await conn.execute("SELECT 1")

    def _listener(self, channel: str):
        def receive(_conn, _pid, _name, payload: str) -> None:
            self._dispatch(channel, payload)

        return receive

    async def _close(self) -> None:
        peek, self._peek = self._peek, None
        if peek is not None:
            peek.close()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                conn.terminate()


def _duplicate_socket(conn: Any) -> socket.socket | None:
    """A second handle on the connection's socket, for `connected` to peek through
    without touching the event loop's own; None where the transport shows none."""
    transport = getattr(conn, "_transport", None)  # asyncpg keeps no public handle
    raw = transport.get_extra_info("socket") if transport is not None else None
    if raw is None:
        return None
    try:
        duplicate = socket.socket(fileno=os.dup(raw.fileno()))
    except OSError:
        return None
    duplicate.setblocking(False)
    return duplicate


def make_signals(settings: Any) -> Signals:
    """PostgreSQL LISTEN/NOTIFY for a PostgreSQL store, else the in-process bus."""
    from orchestra.db.database import is_postgres_url, postgres_params

    url = settings.database_url
    if is_postgres_url(url):
        return PostgresSignals(postgres_params(url))
    return Signals()
