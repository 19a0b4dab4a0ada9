"""What the run store does differently on PostgreSQL.

Many processes may serve one PostgreSQL store, so nothing can be assumed about another
process's runs at start; lease renewals have a connection of their own (they never
queue behind request traffic); reads that decide a write lock their rows.
"""

from __future__ import annotations

import contextlib
from typing import Any

from orchestra.db.database import make_database
from orchestra.engine.store.events import Outbox
from orchestra.engine.store.runs import RunStore


class PostgresRunStore(RunStore):
    def __init__(self, db: Any, *, lease_seconds: float, url: str, outbox: Outbox | None = None) -> None:
        super().__init__(db, lease_seconds=lease_seconds, outbox=outbox)
        self._url = url

    def write_transaction(self):
        return self.db.atomic()

    def locked(self, query):
        return query.for_update()

    async def start(self) -> None:
        """Renewals never queue behind request traffic: a pool of one of their own, which
        the lease loop keeps between renewals (`dedicated`: it takes a connection from no
        one else; tests/store_holds.py allows that wait)."""
        if self.lease_db is self.db:
            self.lease_db = make_database(self._url, pool_size=1)
            self.lease_db.dedicated = True

    async def stop(self) -> None:
        if self.lease_db is not self.db:
            with contextlib.suppress(Exception):  # closing is best effort
                await self.lease_db.close_pool()
