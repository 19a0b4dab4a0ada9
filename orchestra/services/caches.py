"""Which of this process's caches drop their copy when a table changes.

A service that writes a table announces it (`caches.changed("provider")`), exactly as
the PostgreSQL trigger's `cache` hint announces another process's write: the caches
registered for that table forget their copy. No service reaches into another's cache
to invalidate it; the composition root registers each cache here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class Caches:
    """Invalidation by table name: `register` a cache's `invalidate` for the tables it
    reads; `changed(table)` drops every copy built from that table; `invalidate_all`
    drops them all (after a lost LISTEN connection, when hints may have been missed)."""

    def __init__(self) -> None:
        self._by_table: dict[str, list[Callable[[], object]]] = {}
        self._all: list[Callable[[], object]] = []

    def register(self, tables: Iterable[str], invalidate: Callable[[], object]) -> None:
        for table in tables:
            self._by_table.setdefault(table, []).append(invalidate)
        self._all.append(invalidate)

    def changed(self, table: str) -> None:
        for invalidate in self._by_table.get(table, ()):
            invalidate()

    def invalidate_all(self) -> None:
        for invalidate in self._all:
            invalidate()
