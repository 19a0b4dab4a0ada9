"""The resources every entry point shares: settings, the store, hashing, tokens, secrets.

The web app keeps one `Core` on `app.ctx.core`; CLI commands open one for the
duration of a command. Services take it as their first argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestra.db import migrate
from orchestra.db.database import connect, is_postgres_url
from orchestra.db.signals import Signals, make_signals
from orchestra.services.crypto import SecretBox
from orchestra.services.passwords import PasswordService
from orchestra.services.tokens import TokenService
from orchestra.settings import Settings


@dataclass
class Core:
    settings: Settings
    db: Any
    passwords: PasswordService
    tokens: TokenService
    secrets: SecretBox
    signals: Signals  # cross-process hints; listening starts when a server (or engine) needs it
    # Filled by later layers (the engine, caches) when they start; see web/app.py.
    extras: dict[str, Any] = field(default_factory=dict)

    @classmethod
    async def open(cls, settings: Settings, *, migrate_schema: bool = True) -> "Core":
        """Connect the store (applying pending migrations) and build the services."""
        settings.ensure_home()
        secret = settings.load_secret_key()
        db = connect(settings.database_url)
        if migrate_schema:
            await migrate.upgrade(db)
        return cls(
            settings=settings,
            db=db,
            passwords=PasswordService(
                time_cost=settings.argon2_time_cost,
                memory_cost=settings.argon2_memory_cost,
                parallelism=settings.argon2_parallelism,
                concurrency=settings.hash_concurrency,
                queue=settings.hash_queue,
            ),
            tokens=TokenService(
                secret=secret, access_ttl=settings.access_ttl, refresh_ttl=settings.refresh_ttl
            ),
            secrets=SecretBox(secret),
            signals=make_signals(settings),
        )

    @property
    def is_postgres(self) -> bool:
        return is_postgres_url(self.settings.database_url)

    def write_transaction(self):
        """A transaction that reads, then writes. On SQLite it takes the write lock at
        BEGIN (IMMEDIATE): a deferred one that read first would fail with "database is
        locked" when a concurrent writer got in between, instead of waiting its turn."""
        return self.db.atomic() if self.is_postgres else self.db.atomic(lock_type="IMMEDIATE")

    async def close(self) -> None:
        """Stop what was started on this Core (the engine's runs are handed back), then
        release the pool (aiosqlite threads would otherwise keep the process alive)."""
        for hook in self.extras.pop("on_close", []):
            await hook()
        await self.signals.stop()
        self.passwords.close()
        await self.db.close_pool()
