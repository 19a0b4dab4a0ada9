"""Each process's copy of the API keys it has seen, trusted only while the store has not
changed — the mechanism of the user snapshot (services/user_snapshot.py), so a request
with a key costs no store round trip beyond what an access token's costs.

On SQLite `PRAGMA data_version` on a private connection says whether anything was
committed since the copy was taken. On PostgreSQL the triggers of `user` (any change)
and `api_key` (a key created, revoked or deleted; migration 0012) signal every process
on `orchestra_cache`; the copy is trusted only while the listening connection is up. So
a revoked key, a deleted user's key and a demoted user's key are seen at once on every
process. An entry holds the key and its user's current name and role, read together.

What may change is never trusted from here alone: `api_keys.key_workspace` reads the
key's revocation, its user's role and the user's role in the key's workspace (SPEC §16)
from the store for every request made with a key (one indexed row), so a key revoked, a
role changed or a member removed on any process counts at the key's next use, even in
the moment before a PostgreSQL signal arrives. The copy spares the lookup by hash.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
from dataclasses import dataclass, field

from orchestra.db.access_models import ApiKey
from orchestra.db.models import User

MAX_ENTRIES = 10_000  # keys (and unknown hashes) remembered per store version


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """A stored key as one request needs it."""

    key_id: str
    user_id: str
    user_name: str
    role: str
    scopes: frozenset[str]
    templates: frozenset[str] | None
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None
    workspace_id: str | None = None  # the key's workspace (None: stored before 0022 ran)


@dataclass
class KeyUses:
    """When this process last recorded each key's use, and the writes still running."""

    touched: dict[str, dt.datetime] = field(default_factory=dict)
    tasks: set[asyncio.Task] = field(default_factory=set)


class KeyCache:
    """Key hash → `KeyEntry` (or None: no such key), as of the store's current version."""

    def __init__(self, sqlite_path: str | None, signals=None) -> None:
        self._probe: sqlite3.Connection | None = None
        self._signals = signals
        self._changes = 0
        self._version: object = None
        self._entries: dict[str, KeyEntry | None] = {}
        if signals is not None:
            signals.on("cache", lambda table: table in ("user", "api_key") and self.changed())
        if sqlite_path and sqlite_path != ":memory:":
            # timeout=0: never wait on a lock on the event loop (a busy store reads as changed).
            self._probe = sqlite3.connect(
                sqlite_path, timeout=0, isolation_level=None, check_same_thread=False
            )

    def changed(self) -> None:
        """Keys or users changed (a signal, or a write made here): read again next time."""
        self._changes += 1

    def _current_version(self):
        if self._probe is None:
            signals = self._signals
            if signals is None or not signals.connected:
                return None
            return (signals.generation, self._changes)
        try:
            return (self._probe.execute("PRAGMA data_version").fetchone()[0], self._changes)
        except sqlite3.Error:
            return None

    async def lookup(self, db, key_hash: str) -> KeyEntry | None:
        """The key whose secret hashes to `key_hash`, with its user; None if none."""
        version = self._current_version()  # read before the store: a change in between shows next time
        if version is not None and version == self._version and key_hash in self._entries:
            return self._entries[key_hash]
        rows = await db.list(
            ApiKey.select(ApiKey, User.id, User.user_name, User.role)
            .join(User, on=(ApiKey.user == User.id))
            .where(ApiKey.key_hash == key_hash)
        )
        entry = _entry(rows[0]) if rows else None
        if version is not None:
            if version != self._version or len(self._entries) >= MAX_ENTRIES:
                self._version, self._entries = version, {}
            self._entries[key_hash] = entry
        return entry

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def _entry(row: ApiKey) -> KeyEntry:
    user = row.user  # the joined columns (user_name, role) sit on the related User
    return KeyEntry(
        key_id=row.id,
        user_id=user.id,
        user_name=user.user_name,
        role=user.role,
        scopes=frozenset(row.scopes or ()),
        templates=None if row.templates is None else frozenset(row.templates),
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
        workspace_id=row.workspace_id,
    )
