"""The composition root: the resources every entry point shares (settings, the store,
hashing, tokens, secrets, signals) and the one place the run engine is wired to them.

The web app keeps one `Core` on `app.ctx.core`; CLI commands open one for the
duration of a command. Services take it as their first argument. `core.engine` builds
the engine on first use with what it needs from the services (agents, tools, the
upload reader, the signals): the engine itself imports nothing from services.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestra.db import migrate
from orchestra.db.database import connect, is_postgres_url
from orchestra.db.signals import Signals, make_signals
from orchestra.services.crypto import SecretBox
from orchestra.services.passwords import PasswordService
from orchestra.services.tokens import TokenService
from orchestra.settings import Settings

if TYPE_CHECKING:
    from orchestra.engine.engine import Engine


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
    async def open(cls, settings: Settings, *, migrate_schema: bool = True) -> Core:
        """Connect the store (applying pending migrations) and build the services."""
        settings.ensure_home()
        secret = settings.load_secret_key()
        postgres = is_postgres_url(settings.database_url)
        db = connect(settings.database_url, pool_size=settings.db_pool_size if postgres else 8)
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
    def engine(self) -> Engine:
        """This Core's one run engine (kept in `extras["engine"]`), built on first use.
        Deleting a user stops their live runs; closing the Core stops the engine."""
        engine = self.extras.get("engine")
        if engine is None:
            engine = self.extras["engine"] = self._build_engine()
        return engine

    def _build_engine(self) -> Engine:
        # Imported here: services import this module for `Core`.
        from orchestra.db.outage import StoreOutage
        from orchestra.engine.engine import Engine
        from orchestra.services import uploads
        from orchestra.services.agents import agent_cache, tool_registry
        from orchestra.services.outbox import EventOutbox

        async def read_upload(owner_id: str, file_id: str) -> str:
            return await uploads.read_text(self, owner_id=owner_id, file_id=file_id)

        engine = Engine(
            db=self.db,
            settings=self.settings,
            outage=self.extras.setdefault("store_outage", StoreOutage()),
            agents=agent_cache(self),
            registry=tool_registry(self),
            read_upload=read_upload,
            signals=self.signals,
            decrypt=self.secrets.decrypt,
        )
        # The outbox (SPEC §11): run events that subscribers hear of queue their deliveries
        # in the transaction that stores them; this process's delivery loop is woken after.
        engine.store.events.outbox = EventOutbox(self.db, on_queued=self._wake_deliveries)

        async def on_user_deleted(user_id: str) -> None:
            await engine.cancel_owner(user_id, reason="The run's user was deleted.")

        self.extras.setdefault("on_user_deleted", []).append(on_user_deleted)
        self.extras.setdefault("on_close", []).append(engine.stop)
        return engine

    def _wake_deliveries(self) -> None:
        loop = self.extras.get("delivery_loop")
        if loop is not None:
            loop.wake()

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
