"""The secrets an HTTP step names, as the store holds them (SPEC §14): the engine's one
read of the `secret` table, given to `HttpSteps` in its constructor. A run sees its
workspace's secrets and the instance-wide ones (SPEC §16); where both have a name, its
workspace's wins; another workspace's secret is never read."""

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

    async def read(self, names: set[str], workspace_id: str | None = None) -> list[StoredSecret]:
        """The stored secrets among `names` that a run of `workspace_id` may name: the
        workspace's own, else the instance-wide one (a name neither has is left out)."""
        if not names:
            return []
        reach = Secret.workspace_id.is_null()
        if workspace_id is not None:
            reach = reach | (Secret.workspace_id == workspace_id)
        rows = await self.db.list(Secret.select(Secret.name, Secret.value_encrypted, Secret.hosts,
                                                Secret.workspace_id)
                                  .where(Secret.name.in_(sorted(names)) & reach))
        await release_connection(self.db)
        chosen: dict[str, Secret] = {}
        for row in rows:  # the workspace's own first
            if row.name not in chosen or row.workspace_id is not None:
                chosen[row.name] = row
        return [StoredSecret(row.name, row.value_encrypted, row.hosts) for row in chosen.values()]
