"""The composition root: `Core.open(settings)` builds, in this one place, everything a
process shares — the store, hashing, tokens, secrets, signals, the caches and their
invalidation, the agent cache, the tool registry, the MCP catalog, the user snapshot,
the outage state, the API key cache and the run engine — and `close()` takes it down.

The root stands above services and engine: it imports them, nothing in them imports
it (services are typed against `orchestra.services.shared.Shared`, whose fields `Core`
fills). A server's process owner (`orchestra/process.py`) opens one; a CLI command
opens one for its duration.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from orchestra.db import migrate
from orchestra.db.database import connect, is_postgres_url
from orchestra.db.outage import StoreOutage
from orchestra.db.signals import make_signals
from orchestra.engine.engine import Engine
from orchestra.engine.tools import default_registry
from orchestra.engine.tools.mcp.catalog import McpCatalog
from orchestra.services import schedules, uploads
from orchestra.services.agent_cache import AGENT_TABLES, AgentCache
from orchestra.services.caches import Caches
from orchestra.services.crypto import SecretBox
from orchestra.services.key_cache import KeyCache, KeyUses
from orchestra.services.outbox import EventOutbox
from orchestra.services.passwords import PasswordService
from orchestra.services.shared import Shared
from orchestra.services.tokens import TokenService
from orchestra.services.user_snapshot import UserSnapshot
from orchestra.services.workspaces import TABLE as WORKSPACE_TABLE
from orchestra.settings import Settings

MCP_TABLES = frozenset({"mcp_server"})


@dataclass(eq=False)
class Core(Shared):
    """Everything this process shares, built by `open` (see `Shared` for the fields)."""

    @classmethod
    async def open(cls, settings: Settings, *, migrate_schema: bool = True) -> Core:
        """Connect the store (applying pending migrations) and build every part."""
        settings.ensure_home()
        secret = settings.load_secret_key()
        postgres = is_postgres_url(settings.database_url)
        db = connect(settings.database_url, pool_size=settings.db_pool_size if postgres else 8,
                     busy_timeout=settings.db_busy_timeout,
                     # a frozen process's open transaction must not outlast its leases
                     idle_transaction_timeout=max(5.0, settings.run_lease_seconds))
        if migrate_schema:
            await migrate.upgrade(db)
        secrets = SecretBox(secret)
        signals = make_signals(settings)
        mcp_catalog = McpCatalog(db, secrets.decrypt)
        tool_registry = default_registry()
        tool_registry.add_source(mcp_catalog)
        core = cls(
            settings=settings,
            db=db,
            is_postgres=postgres,
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
            secrets=secrets,
            signals=signals,
            outage=StoreOutage(),
            caches=Caches(),
            # On SQLite it probes the file's version; on PostgreSQL a trigger's hint.
            user_snapshot=UserSnapshot(
                None if postgres else db.database,
                signals if postgres else None,
                access_ttl=settings.access_ttl,
            ),
            agent_cache=AgentCache(db, secrets.decrypt, signals),
            tool_registry=tool_registry,
            mcp_catalog=mcp_catalog,
            # On SQLite it probes the file's version; on PostgreSQL the triggers' hints.
            key_cache=KeyCache(None if postgres else db.database, signals if postgres else None),
            key_uses=KeyUses(),
        )
        wire_caches(core)

        async def stop_their_runs(user_id: str) -> None:
            if (engine := core.built_engine()) is not None:  # else no run of theirs is here
                await engine.cancel_owner(user_id, reason="The run's user was deleted.")

        async def drop_their_workers(user_id: str) -> None:  # they went with the user
            core.caches.changed("worker")

        core.on_user_deleted.extend((stop_their_runs, drop_their_workers))
        return core

    @cached_property
    def engine(self) -> Engine:
        """The run engine, built on first use (a request that only reads needs none)."""
        return build_engine(self)

    def built_engine(self) -> Engine | None:
        """The engine if it was built, else None."""
        return self.__dict__.get("engine")

    async def close(self) -> None:
        """Stop the engine (its runs are handed back), stop listening, then release the
        pool (aiosqlite threads would otherwise keep the process alive)."""
        if (engine := self.built_engine()) is not None:
            await engine.stop()
        await self.signals.stop()
        self.passwords.close()
        await self.db.close_pool()


def wire_caches(core: Shared) -> None:
    """A change on any process (the PostgreSQL trigger's `cache` hint, or a reload
    anywhere) drops the copies built from that table; a lost LISTEN connection drops
    them all, since hints may have been missed."""
    core.caches.register(AGENT_TABLES, core.agent_cache.invalidate)
    core.caches.register(MCP_TABLES, core.mcp_catalog.invalidate)
    # The fire loop's next due time is a copy too: a schedule saved anywhere wakes it.
    core.caches.register([schedules.TABLE], lambda: schedules.wake_fire_loop(core))
    core.signals.on("cache", core.caches.changed)
    core.signals.on_resync(core.caches.invalidate_all)


def build_engine(core: Shared) -> Engine:
    """A run engine given this process's parts (a test builds a second one to play the
    next process after a stop)."""

    async def read_upload(owner_id: str, file_id: str) -> str:
        return await uploads.read_text(core, owner_id=owner_id, file_id=file_id)

    engine = Engine(
        db=core.db,
        settings=core.settings,
        outage=core.outage,
        agents=core.agent_cache,
        registry=core.tool_registry,
        read_upload=read_upload,
        signals=core.signals,
        decrypt=core.secrets.decrypt,
        # The outbox (SPEC §11): run events that subscribers hear of queue their deliveries
        # in the transaction that stores them; this process's delivery loop is woken after.
        outbox=EventOutbox(core.db, on_queued=core.delivery_wake.set),
    )
    # Which workspaces have a monthly budget is a copy too (SPEC §16): a change of any
    # workspace's limits, here or in another process, drops it.
    core.caches.register([WORKSPACE_TABLE], engine.workspace_limits_changed)
    return engine
