"""The agent cache: the engine's view of workers and system nodes as `AgentConfig`s.

Read from the store in one go and kept until invalidated (through `Caches`: a write
to one of `AGENT_TABLES` here or on another process drops it), or until `max_age`
seconds pass, which bounds staleness across processes. It is given the store, the
secret box's `decrypt` and the signals by the composition root; it imports no service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestra import redaction
from orchestra.db.models import Provider, Skill, SystemNode, Worker, storable
from orchestra.db.signals import Signals
from orchestra.db.snapshot import StoreSnapshot
from orchestra.services.node_specs import NODE_SPECS

logger = logging.getLogger("orchestra.agents")

# The tables an AgentConfig is read from ("agents": an explicit reload anywhere).
AGENT_TABLES = frozenset({"provider", "worker", "skill", "system_node", "agents"})


@dataclass(frozen=True)
class AgentConfig:
    """Everything the engine needs to run one agent step."""

    kind: str  # "worker" | "node"
    id: str  # worker_id or node name
    owner_id: str | None
    name: str
    system_prompt: str
    skill_instructions: str | None
    tools: tuple[str, ...]
    provider_id: str | None
    provider_kind: str | None
    provider_base_url: str | None
    provider_api_key: str | None  # decrypted
    model: str | None  # the agent's model, else the provider's model_id
    provider_name: str | None = None
    provider_prices: dict[str, Any] | None = None  # the provider's own prices (SPEC §12)
    provider_limits: dict[str, Any] | None = None  # requests/tokens per minute, concurrency


class AgentCache:
    """Workers and nodes as AgentConfigs. A worker missing from the cache is looked up
    in the store (it may have been created by another server process)."""

    def __init__(
        self, db: Any, decrypt: Callable[[str], str], signals: Signals, *, max_age: float = 30.0
    ) -> None:
        self._db = db
        self._decrypt = decrypt
        self._signals = signals
        self._snapshot: StoreSnapshot[tuple[dict[str, AgentConfig], dict[str, AgentConfig]]] = (
            StoreSnapshot(self._read, ({}, {}), max_age=max_age)
        )

    def invalidate(self) -> None:
        """Forget everything; the next lookup reads the store again."""
        self._snapshot.invalidate()

    async def reload(self) -> dict[str, int]:
        """Drop the cached state and read it again; returns `{workers, nodes}` counts."""
        self.invalidate()
        workers, nodes = await self._snapshot.current()
        return {"workers": len(workers), "nodes": len(nodes)}

    async def reload_everywhere(self) -> dict[str, int]:
        """Reload this process's copy now and tell every other process to drop its own."""
        counts = await self.reload()
        await self._signals.notify("cache", "agents")
        return counts

    async def worker(self, worker_id: str) -> AgentConfig | None:
        workers, _ = await self._snapshot.current()
        config = workers.get(worker_id)
        if config is None and storable(worker_id):
            row = await Worker.aget_or_none(Worker.id == worker_id)
            if row is not None:
                config = (await self._worker_configs([row])).get(worker_id)
        return config

    async def node(self, name: str) -> AgentConfig | None:
        _, nodes = await self._snapshot.current()
        return nodes.get(name)

    async def _read(self) -> tuple[dict[str, AgentConfig], dict[str, AgentConfig]]:
        workers = await self._db.list(Worker.select())
        return await self._worker_configs(workers), await self._node_configs()

    async def _providers_by_id(self, ids: set[str]) -> dict[str, Provider]:
        if not ids:
            return {}
        rows = await self._db.list(Provider.select().where(Provider.id.in_(list(ids))))
        return {p.id: p for p in rows}

    def _provider_fields(
        self, provider: Provider | None, model: str | None, keys: dict[str, str | None]
    ) -> dict[str, Any]:
        """The provider half of an AgentConfig; `keys` memoises decryption per provider."""
        if provider is None:
            return {"provider_id": None, "provider_kind": None, "provider_base_url": None,
                    "provider_api_key": None, "model": model, "provider_name": None,
                    "provider_prices": None, "provider_limits": None}
        if provider.id not in keys:
            try:
                keys[provider.id] = (None if provider.api_key_encrypted is None
                                     else self._decrypt(provider.api_key_encrypted))
                redaction.remember_credentials([keys[provider.id]])
            except ValueError:
                logger.warning("API key of provider %s cannot be decrypted", provider.name)
                keys[provider.id] = None
        return {
            "provider_id": provider.id,
            "provider_kind": provider.kind,
            "provider_base_url": provider.base_url,
            "provider_api_key": keys[provider.id],
            "model": model or provider.model_id,
            "provider_name": provider.name,
            "provider_prices": provider.prices,
            "provider_limits": provider.limits,
        }

    async def _worker_configs(self, workers: list[Worker]) -> dict[str, AgentConfig]:
        providers = await self._providers_by_id({w.provider_id for w in workers})
        skill_names = {w.bound_skill for w in workers if w.bound_skill}
        skills: dict[str, str] = {}
        if skill_names:
            rows = await self._db.list(Skill.select().where(Skill.name.in_(list(skill_names))))
            skills = {s.name: s.instructions for s in rows}
        keys: dict[str, str | None] = {}
        return {
            w.id: AgentConfig(
                kind="worker",
                id=w.id,
                owner_id=w.owner_id,
                name=w.name,
                system_prompt=w.system_prompt or "",
                skill_instructions=skills.get(w.bound_skill) if w.bound_skill else None,
                tools=tuple(w.tools or ()),
                **self._provider_fields(providers.get(w.provider_id), w.model, keys),
            )
            for w in workers
        }

    async def _node_configs(self) -> dict[str, AgentConfig]:
        rows = {n.name: n for n in await self._db.list(SystemNode.select())}
        providers = await self._providers_by_id(
            {n.provider_id for n in rows.values() if n.provider_id})
        configs, keys = {}, {}
        for spec in NODE_SPECS.values():
            row = rows.get(spec.name)
            provider = providers.get(row.provider_id) if row and row.provider_id else None
            configs[spec.name] = AgentConfig(
                kind="node",
                id=spec.name,
                owner_id=None,
                name=spec.name,
                system_prompt=spec.system_prompt,
                skill_instructions=None,
                tools=spec.tools,
                **self._provider_fields(provider, row.model if row else None, keys),
            )
        return configs
