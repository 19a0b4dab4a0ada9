"""A value read from the store and kept in this process until it is invalidated (a cache
hint from any process) or older than `max_age` seconds, which bounds staleness when a
hint is missed. One reader at a time refreshes it; a read that an invalidation overtook
is not kept, so a change made while the store was being read is never lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class StoreSnapshot(Generic[T]):
    """`await current()` gives the kept value, reading it again with `read` when stale."""

    def __init__(self, read: Callable[[], Awaitable[T]], empty: T, *, max_age: float = 30.0) -> None:
        self._read = read
        self._max_age = max_age
        self.value: T = empty  # the last value read (`empty` before the first read)
        self._loaded_at: float | None = None
        self._generation = 0
        self._lock: asyncio.Lock | None = None  # made on first use, inside the running loop

    def invalidate(self) -> None:
        """Forget the kept value; the next `current()` reads the store again."""
        self._generation += 1
        self._loaded_at = None

    def fresh(self) -> bool:
        return self._loaded_at is not None and time.monotonic() - self._loaded_at < self._max_age

    async def current(self) -> T:
        if self.fresh():
            return self.value
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while not self.fresh():
                generation = self._generation
                value = await self._read()
                if generation == self._generation:  # not invalidated while reading
                    self.value, self._loaded_at = value, time.monotonic()
        return self.value
