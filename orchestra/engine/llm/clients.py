"""The engine's provider clients: one per provider, reused by every step and run.

Building a client is costly (a provider SDK's import, TLS set-up), so clients are kept.
They are kept by provider id beside a salted digest of what each was built from (kind,
base URL, API key) — never the key itself. When a provider's key or URL changes (a
rotated key), the next step builds a new client, and the old one is closed as soon as
no call streams through it; a step that was using it goes on with the new one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from orchestra.engine.llm.base import ChatClient

logger = logging.getLogger("orchestra.engine")


class ProviderConfig(Protocol):
    """What a client is built from (services' AgentConfig has these fields)."""

    provider_id: str | None
    provider_kind: str | None
    provider_base_url: str | None
    provider_api_key: str | None


class _Entry:
    """One built client: how many calls are in flight, and whether it was replaced."""

    __slots__ = ("busy", "client", "closed", "fingerprint", "retired")

    def __init__(self, client: ChatClient, fingerprint: bytes) -> None:
        self.client = client
        self.fingerprint = fingerprint
        self.busy = 0
        self.retired = False
        self.closed = False


class ProviderClients:
    """Clients by provider; `get` builds (in a thread) or reuses, `close` closes all."""

    def __init__(self, build: Callable[[ProviderConfig], ChatClient]) -> None:
        self._build = build
        self._salt = os.urandom(16)  # the digests mean nothing outside this process
        self._entries: dict[str, _Entry] = {}
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task] = set()

    def fingerprint(self, config: ProviderConfig) -> bytes:
        """A salted digest of (kind, base URL, key): tells a changed provider apart."""
        parts = [config.provider_kind, config.provider_base_url, config.provider_api_key]
        return hmac.new(self._salt, json.dumps(parts).encode(), hashlib.sha256).digest()

    def providers(self) -> list[str]:
        """The provider ids a client is kept for."""
        return list(self._entries)

    async def get(
        self, config: ProviderConfig, *, before_build: Callable[[], Awaitable[None]] | None = None,
    ) -> PooledClient:
        """The provider's client, built first when there is none or the provider changed
        (`before_build` runs then: e.g. to hand back a store connection meanwhile)."""
        key = config.provider_id or ""
        fingerprint = self.fingerprint(config)
        entry = self._entries.get(key)
        if entry is None or entry.fingerprint != fingerprint:
            if before_build is not None:
                await before_build()
            async with self._lock:
                entry = self._entries.get(key)
                if entry is None or entry.fingerprint != fingerprint:
                    client = await asyncio.to_thread(self._build, config)
                    replaced, entry = entry, _Entry(client, fingerprint)
                    self._entries[key] = entry
                    if replaced is not None:
                        self._retire(replaced)
        return PooledClient(self, key, entry)

    async def close(self) -> None:
        """Close every client (those in use are closed when their calls end)."""
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            self._retire(entry)
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    def _current(self, key: str, entry: _Entry) -> _Entry:
        if not entry.retired:
            return entry
        current = self._entries.get(key)
        return current if current is not None else entry

    def _retire(self, entry: _Entry) -> None:
        entry.retired = True
        self._close_if_idle(entry)

    def _close_if_idle(self, entry: _Entry) -> None:
        if entry.retired and entry.busy == 0 and not entry.closed:
            entry.closed = True
            task = asyncio.get_running_loop().create_task(_close_quietly(entry.client))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


class PooledClient:
    """A pooled client as a step holds it: each call goes to the provider's current
    client and is counted, so a replaced client closes only when its calls are done."""

    def __init__(self, pool: ProviderClients, key: str, entry: _Entry) -> None:
        self._pool = pool
        self._key = key
        self._entry = entry

    def __getattr__(self, name: str) -> Any:
        return getattr(self._entry.client, name)

    async def stream_chat(self, **options: Any) -> AsyncIterator[Any]:
        entry = self._entry = self._pool._current(self._key, self._entry)
        entry.busy += 1
        try:
            async for event in entry.client.stream_chat(**options):
                yield event
        finally:
            entry.busy -= 1
            self._pool._close_if_idle(entry)

    async def list_models(self) -> list[str]:
        entry = self._entry = self._pool._current(self._key, self._entry)
        entry.busy += 1
        try:
            return await entry.client.list_models()
        finally:
            entry.busy -= 1
            self._pool._close_if_idle(entry)


async def _close_quietly(client: ChatClient) -> None:
    try:
        await client.aclose()
    except Exception as exc:  # noqa: BLE001 - closing is best effort
        logger.debug("closing a replaced provider client failed: %s", type(exc).__name__)
