"""Apply and report schema migrations (playhouse.migrations) on the async database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from playhouse.migrations import Runner

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


@dataclass(frozen=True)
class MigrationState:
    name: str
    applied_at: datetime | None


def _runner(db) -> Runner:
    return Runner(db, directory=str(MIGRATIONS_DIR))


async def upgrade(db) -> list[str]:
    """Apply every pending migration in order; returns the names applied."""
    return await db.run(lambda: _runner(db).up())


async def status(db) -> list[MigrationState]:
    """Every known migration with the time it was applied (None: pending)."""
    rows = await db.run(lambda: _runner(db).status())
    return [MigrationState(m.name, m.applied) for m in rows]
