"""An in-process copy of the user table, re-read only after the store has changed.

`GET /auth/list` and the role re-confirmation of every protected route read the same
small table on every request. On SQLite, `PRAGMA data_version` on a private connection
tells in microseconds whether any other connection (this process's pool, a CLI
command) has committed since the copy was taken; only then is the table read again.
On PostgreSQL a trigger signals every change of the table to every process
(`LISTEN`/`NOTIFY`, see db/signals.py); the copy is trusted only while the listening
connection is up, and any signal or reconnection makes it stale. Changes made by this
process mark it stale at once (`changed()`), without waiting for their own signal.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from orchestra.db.models import User


@dataclass
class _Copy:
    version: object = None
    users: list[User] = field(default_factory=list)
    by_id: dict[str, User] = field(default_factory=dict)


class UserSnapshot:
    """The users, oldest first, as of the store's current data version."""

    def __init__(self, sqlite_path: str | None, signals=None) -> None:
        self._probe: sqlite3.Connection | None = None
        self._signals = signals
        self._changes = 0
        if signals is not None:
            signals.on("cache", lambda table: table == "user" and self.changed())
        if sqlite_path and sqlite_path != ":memory:":
            # timeout=0: never wait on a lock on the event loop; a busy store just
            # means "changed", and the caller reads it the ordinary (async) way.
            self._probe = sqlite3.connect(
                sqlite_path, timeout=0, isolation_level=None, check_same_thread=False
            )
        self._copy = _Copy()

    def changed(self) -> None:
        """The table changed (a signal, or a write made here): read it again next time."""
        self._changes += 1

    def _version(self):
        if self._probe is None:
            signals = self._signals
            if signals is None or not signals.connected:
                return None
            return (signals.generation, self._changes)
        try:
            return self._probe.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return None

    def current(self) -> _Copy | None:
        """The copy when nothing was committed since it was taken, else None."""
        version = self._version()
        if version is None or version != self._copy.version:
            return None
        return self._copy

    async def users(self, db) -> list[User]:
        """Every user, oldest first; from the copy when it is still current."""
        version = self._version()
        if version is not None and version == self._copy.version:
            return self._copy.users
        # The version is read *before* the table: a commit in between makes the next
        # version differ, so a copy is never kept past a change it did not see.
        users = await db.list(User.select().order_by(User.created_at, User.id))
        if version is not None:
            self._copy = _Copy(version, users, {u.id: u for u in users})
        return users

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None
