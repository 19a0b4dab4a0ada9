"""An in-process copy of the user table, re-read only after the store has changed.

`GET /auth/list` and the role re-confirmation of every protected route read the same
small table on every request. On SQLite, `PRAGMA data_version` on a private connection
tells in microseconds whether any other connection (this process's pool, a CLI
command) has committed since the copy was taken; only then is the table read again.
On PostgreSQL a trigger signals every change of the table to every process
(`LISTEN`/`NOTIFY`, see db/signals.py); the copy is trusted only while the listening
connection is up, and any signal or reconnection makes it stale. Changes made by this
process mark it stale at once (`changed()`), without waiting for their own signal.

The copy also holds the refresh families whose access tokens were stopped within the
last access-token lifetime (older ones have no live access token left), read under the
same version: on PostgreSQL a trigger signals each such revocation (`refresh_token`);
on SQLite the revoking commit changes `data_version`. So the check that an access
token's family is still alive costs no store round trip while nothing has changed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
from dataclasses import dataclass, field

from peewee import fn

from orchestra.db.models import RefreshToken, User, utcnow

CLOCK_SLACK_SECONDS = 60  # processes' clocks may differ a little: keep revocations longer


@dataclass
class UserCopy:
    """The user table (and recent revocations) as of one store version."""

    version: object = None
    users: list[User] = field(default_factory=list)
    by_id: dict[str, User] = field(default_factory=dict)
    # family -> when its access tokens were stopped; user id -> the latest such time
    revoked_families: frozenset[str] = frozenset()
    user_revoked_at: dict[str, dt.datetime] = field(default_factory=dict)

    def access_revoked(self, user_id: str, family: str | None, issued_at: float) -> bool:
        """Whether an access token of `user_id` (family `family`, or none on a token minted
        before families were named; issued at `issued_at`) was revoked."""
        if family is not None:
            return family in self.revoked_families
        latest = self.user_revoked_at.get(user_id)
        return latest is not None and latest >= naive_utc(issued_at)


def naive_utc(timestamp: float) -> dt.datetime:
    """A unix time as the store's naive UTC datetime."""
    return dt.datetime.fromtimestamp(int(timestamp), dt.UTC).replace(tzinfo=None)


class UserSnapshot:
    """The users, oldest first, as of the store's current data version."""

    def __init__(self, sqlite_path: str | None, signals=None, *, access_ttl: int = 15 * 60) -> None:
        self._probe: sqlite3.Connection | None = None
        self._signals = signals
        self._changes = 0
        self._window = dt.timedelta(seconds=access_ttl + CLOCK_SLACK_SECONDS)
        if signals is not None:
            signals.on("cache", lambda table: table in ("user", "refresh_token") and self.changed())
        if sqlite_path and sqlite_path != ":memory:":
            # timeout=0: never wait on a lock on the event loop; a busy store just
            # means "changed", and the caller reads it the ordinary (async) way.
            self._probe = sqlite3.connect(
                sqlite_path, timeout=0, isolation_level=None, check_same_thread=False
            )
        self._copy = UserCopy()
        self._probed = None  # SQLite: (loop, data_version) of this loop iteration (_version)

    def changed(self) -> None:
        """The table changed (a signal, or a write made here): read it again next time."""
        self._changes += 1
        self._probed = None

    def _version(self):
        if self._probe is None:
            signals = self._signals
            if signals is None or not signals.connected:
                return None
            return (signals.generation, self._changes)
        loop = asyncio._get_running_loop()
        probed = self._probed
        if probed is not None and probed[0] is loop:
            return probed[1]
        try:
            version = self._probe.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return None
        # One probe serves the requests the event loop runs in this iteration: the
        # answer is forgotten by a callback that runs before anything the loop reads
        # from a socket afterwards, so every request that arrives after a commit (made
        # anywhere) is checked against a probe taken after it.
        if loop is not None:
            loop.call_soon(self._forget_probe)
            self._probed = (loop, version)
        return version

    def _forget_probe(self) -> None:
        self._probed = None

    def current(self) -> UserCopy | None:
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
            revoked = await db.list(
                RefreshToken.select(
                    RefreshToken.family, RefreshToken.user,
                    fn.MAX(RefreshToken.access_revoked_at).alias("at"),
                )
                .where(RefreshToken.access_revoked_at > utcnow() - self._window)
                .group_by(RefreshToken.family, RefreshToken.user)
            )
            latest: dict[str, dt.datetime] = {}
            for row in revoked:
                at = _as_datetime(row.at)
                if row.user_id not in latest or at > latest[row.user_id]:
                    latest[row.user_id] = at
            self._copy = UserCopy(version, users, {u.id: u for u in users},
                               frozenset(row.family for row in revoked), latest)
        return users

    def close(self) -> None:
        """Close the SQLite probe connection."""
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def _as_datetime(value) -> dt.datetime:
    """An aggregate's datetime (SQLite hands MAX() back as text)."""
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None)
    return dt.datetime.fromisoformat(str(value))
