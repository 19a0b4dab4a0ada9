"""The secrets an HTTP step names, as the store holds them (SPEC §14): the engine's one
read of the `secret` table, given to `HttpSteps` in its constructor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestra.db.database import release_connection
from orchestra.db.models import Secret


@dataclass(frozen=True)
class StoredSecret:
    name: str
    value_encrypted: str  # SecretBox ciphertext: the reader never decrypts
    hosts: list[str] | None  # where it may be sent; None: stored before hosts, unusable


class SecretReader:
    """Reads stored secrets by name; the connection goes back before the step goes on."""

    def __init__(self, db: Any) -> None:
        self.db = db

    async def read(self, names: set[str]) -> list[StoredSecret]:
        """The stored secrets among `names` (a name nobody stored is left out)."""
        if not names:
            return []
        rows = await self.db.list(Secret.select(Secret.name, Secret.value_encrypted, Secret.hosts)
                                  .where(Secret.name.in_(sorted(names))))
        await release_connection(self.db)
        return [StoredSecret(row.name, row.value_encrypted, row.hosts) for row in rows]
