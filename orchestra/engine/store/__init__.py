"""The run store: the engine's only SQL about runs (claims and leases, fencing, rows,
the event log), one subclass per SQL dialect where they differ."""

from __future__ import annotations

from typing import Any

from orchestra.db.database import is_postgres_url
from orchestra.engine.store.events import Outbox
from orchestra.engine.store.postgres import PostgresRunStore
from orchestra.engine.store.runs import RunStore


def make_run_store(db: Any, *, url: str, lease_seconds: float, outbox: Outbox | None = None) -> RunStore:
    """The run store for the database at `url` (its dialect's subclass); `outbox` queues
    the deliveries of the events it stores (SPEC §11)."""
    if is_postgres_url(url):
        return PostgresRunStore(db, lease_seconds=lease_seconds, url=url, outbox=outbox)
    return RunStore(db, lease_seconds=lease_seconds, outbox=outbox)


__all__ = ["PostgresRunStore", "RunStore", "make_run_store"]
