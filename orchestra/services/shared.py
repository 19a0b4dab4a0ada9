"""What every service is given: `Shared`, one per process (or CLI command).

The store, a write transaction, the caches and their invalidation, and the parts the
composition root (`orchestra/core.py`) built once — the agent cache, the tool registry,
the MCP catalog, the user snapshot, the outage state and the run engine — as typed
fields. Services import this module, never the root: the root stands above them and
builds this object.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from peewee import Database

from orchestra.db.outage import StoreOutage
from orchestra.db.signals import Signals
from orchestra.engine.tools.base import ToolRegistry
from orchestra.engine.tools.mcp.catalog import McpCatalog
from orchestra.services.agent_cache import AgentCache
from orchestra.services.caches import Caches
from orchestra.services.crypto import SecretBox
from orchestra.services.key_cache import KeyCache, KeyUses
from orchestra.services.passwords import PasswordService
from orchestra.services.tokens import TokenService
from orchestra.services.user_snapshot import UserSnapshot
from orchestra.settings import Settings

if TYPE_CHECKING:
    from orchestra.engine.engine import Engine

UserDeletedHook = Callable[[str], Awaitable[None]]


@dataclass(eq=False)
class Shared:
    """The resources and parts services share; built by `orchestra.core.Core.open`."""

    settings: Settings
    db: Database
    is_postgres: bool  # the store is PostgreSQL (else SQLite, served by one process)
    passwords: PasswordService
    tokens: TokenService
    secrets: SecretBox
    signals: Signals  # cross-process hints; listening starts when a server (or engine) needs it
    outage: StoreOutage  # this process's view of a store outage (requests and engine share it)
    caches: Caches  # a write announces the table it changed; the caches of it drop their copy
    user_snapshot: UserSnapshot
    agent_cache: AgentCache
    tool_registry: ToolRegistry  # the built-in tools, then the MCP catalog's
    mcp_catalog: McpCatalog
    key_cache: KeyCache  # API keys as requests read them
    key_uses: KeyUses  # when each key's use was last recorded here
    # Called (in order) after a user was deleted: their live runs stop, caches drop them.
    on_user_deleted: list[UserDeletedHook] = field(default_factory=list)
    # Webhook hooks' verifiers by secret ciphertext (decrypted once per process), oldest first.
    hook_verifiers: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    # Early wake-ups of this process's delivery and schedule loops (they also poll): a
    # write sets one, the loop (services/deliveries.py, schedule_fires.py), given this
    # record, waits on it. Set with no loop running (a CLI command), nothing happens.
    delivery_wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    fire_wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    # The run engine, given the parts above: built by the root on first use (reading a
    # run needs none), so it is not part of the record's repr or equality.
    engine: Engine = field(init=False, repr=False, compare=False)

    def write_transaction(self):
        """A transaction that reads, then writes. On SQLite it takes the write lock at
        BEGIN (IMMEDIATE): a deferred one that read first would fail with "database is
        locked" when a concurrent writer got in between, instead of waiting its turn."""
        return self.db.atomic() if self.is_postgres else self.db.atomic(lock_type="IMMEDIATE")
