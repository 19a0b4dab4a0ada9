"""The agent platform (SPEC §3): tools, skills, workers, system nodes, and the agent cache.

Skills and system nodes are shared (administrators manage them); workers belong to
their owner, and another user's worker is simply not found. The workflow engine reads
agents only through `agent_cache(core)`, which every write here invalidates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from peewee import IntegrityError

from orchestra.core import Core
from orchestra.db.models import Provider, Skill, SystemNode, Worker, iso, name_key, storable, utcnow
from orchestra.db.snapshot import StoreSnapshot
from orchestra.engine.tools import ToolRegistry, default_registry
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page
from orchestra.services.providers import (
    clean_model,
    clean_name,
    clean_text,
    decrypt_api_key,
)

logger = logging.getLogger("orchestra.agents")

_UNSET: Any = object()
PROMPT_MAX = 100_000


# --- tools ----------------------------------------------------------------------------------


def tool_registry(core: Core) -> ToolRegistry:
    """The one tool registry of this Core: the built-ins, then the MCP servers' tools
    (a test may install its own in core.extras["tool_registry"])."""
    registry = core.extras.get("tool_registry")
    if registry is None:
        from orchestra.services.mcp import mcp_catalog  # mcp imports this package's peers

        registry = core.extras["tool_registry"] = default_registry()
        registry.add_source(mcp_catalog(core))
    return registry


async def list_tools(core: Core) -> list[dict[str, Any]]:
    """`[{name, description, parameters, source}]` of every tool a worker may use."""
    registry = tool_registry(core)
    await registry.load()
    return registry.catalog()


# --- system nodes: built in, only provider and model are editable ------------------------------


@dataclass(frozen=True)
class NodeSpec:
    name: str
    description: str
    system_prompt: str
    tools: tuple[str, ...]


NODE_SPECS: dict[str, NodeSpec] = {
    spec.name: spec
    for spec in (
        NodeSpec(
            "planner",
            "Breaks a request into ordered, concrete steps.",
            "You are the planner. Break the user's request into a short numbered list of "
            "concrete steps, noting what each step needs from the ones before it.",
            ("current_time",),
        ),
        NodeSpec(
            "reviewer",
            "Checks work for errors and gaps and says what to fix.",
            "You are the reviewer. Check the work you are given for errors, gaps and "
            "unsupported claims; verify any arithmetic with the calculator. Answer with a "
            "verdict and a list of concrete fixes.",
            ("calculator",),
        ),
        NodeSpec(
            "summarizer",
            "Condenses text and uploaded files into a short summary.",
            "You are the summarizer. Condense what you are given (read uploaded files "
            "when their ids are mentioned) into a short, faithful summary.",
            ("read_upload",),
        ),
    )
}


# --- the agent cache: the engine's view of workers and nodes -----------------------------------


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
    """Workers and nodes as AgentConfigs, read from the store in one go and kept until
    invalidated. A worker missing from the cache is looked up in the store (it may have
    been created by another server process); entries older than `max_age` seconds are
    reloaded, which bounds staleness across processes."""

    def __init__(self, core: Core, *, max_age: float = 30.0) -> None:
        self._core = core
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

    async def worker(self, worker_id: str) -> AgentConfig | None:
        workers, _ = await self._snapshot.current()
        config = workers.get(worker_id)
        if config is None and storable(worker_id):
            row = await Worker.aget_or_none(Worker.id == worker_id)
            if row is not None:
                config = (await _worker_configs(self._core, [row])).get(worker_id)
        return config

    async def node(self, name: str) -> AgentConfig | None:
        _, nodes = await self._snapshot.current()
        return nodes.get(name)

    async def _read(self) -> tuple[dict[str, AgentConfig], dict[str, AgentConfig]]:
        workers = await self._core.db.list(Worker.select())
        return await _worker_configs(self._core, workers), await _node_configs(self._core)


AGENT_TABLES = frozenset({"provider", "worker", "skill", "system_node", "agents"})


def agent_cache(core: Core) -> AgentCache:
    """The one AgentCache of this Core (kept in core.extras["agent_cache"])."""
    cache = core.extras.get("agent_cache")
    if cache is None:
        cache = core.extras["agent_cache"] = AgentCache(core)
        # A change on any process (a trigger on PostgreSQL), or a reload anywhere, drops
        # this copy; so does a lost LISTEN connection, since signals may have been missed.
        core.signals.on("cache", lambda table: table in AGENT_TABLES and cache.invalidate())
        core.signals.on_resync(cache.invalidate)

        async def _on_user_deleted(user_id: str) -> None:  # their workers went with them
            cache.invalidate()

        core.extras.setdefault("on_user_deleted", []).append(_on_user_deleted)
    return cache


async def reload_everywhere(core: Core) -> dict[str, int]:
    """Reload this process's agent state now and tell every other process to drop its copy."""
    counts = await agent_cache(core).reload()
    await core.signals.notify("cache", "agents")
    return counts


def _invalidate(core: Core) -> None:
    agent_cache(core).invalidate()


async def _providers_by_id(core: Core, ids: set[str]) -> dict[str, Provider]:
    if not ids:
        return {}
    rows = await core.db.list(Provider.select().where(Provider.id.in_(list(ids))))
    return {p.id: p for p in rows}


def _provider_fields(
    core: Core, provider: Provider | None, model: str | None, keys: dict[str, str | None]
) -> dict[str, Any]:
    """The provider half of an AgentConfig; `keys` memoises decryption per provider."""
    if provider is None:
        return {"provider_id": None, "provider_kind": None, "provider_base_url": None,
                "provider_api_key": None, "model": model, "provider_name": None,
                "provider_prices": None, "provider_limits": None}
    if provider.id not in keys:
        try:
            keys[provider.id] = decrypt_api_key(core, provider)
        except ValueError:
            logger.warning("API key of provider %s cannot be decrypted", provider.name)
            keys[provider.id] = None
    key = keys[provider.id]
    return {
        "provider_id": provider.id,
        "provider_kind": provider.kind,
        "provider_base_url": provider.base_url,
        "provider_api_key": key,
        "model": model or provider.model_id,
        "provider_name": provider.name,
        "provider_prices": provider.prices,
        "provider_limits": provider.limits,
    }


async def _worker_configs(core: Core, workers: list[Worker]) -> dict[str, AgentConfig]:
    providers = await _providers_by_id(core, {w.provider_id for w in workers})
    skill_names = {w.bound_skill for w in workers if w.bound_skill}
    skills: dict[str, str] = {}
    if skill_names:
        rows = await core.db.list(Skill.select().where(Skill.name.in_(list(skill_names))))
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
            **_provider_fields(core, providers.get(w.provider_id), w.model, keys),
        )
        for w in workers
    }


async def _node_configs(core: Core) -> dict[str, AgentConfig]:
    rows = {n.name: n for n in await core.db.list(SystemNode.select())}
    providers = await _providers_by_id(core, {n.provider_id for n in rows.values() if n.provider_id})
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
            **_provider_fields(core, provider, row.model if row else None, keys),
        )
    return configs


# --- skills --------------------------------------------------------------------------------------


def skill_view(skill: Skill) -> dict[str, Any]:
    return {
        "skill_id": skill.id,
        "id": skill.id,
        "name": skill.name,
        "description": skill.description,
        "instructions": skill.instructions,
        "created_at": iso(skill.created_at),
        "updated_at": iso(skill.updated_at),
    }


def _skill_name_taken(name: str) -> ConflictError:
    return ConflictError(f"A skill named '{name}' already exists (names ignore case).")


async def _ensure_skill_name_free(core: Core, name: str, *, except_id: str | None = None) -> None:
    """A friendly early 409; the unique index on `name_key` is what decides under races."""
    query = Skill.select(Skill.id).where(Skill.name_key == name_key(name))
    if except_id is not None:
        query = query.where(Skill.id != except_id)
    if await core.db.exists(query):
        raise _skill_name_taken(name)


async def create_skill(core: Core, *, name: str, description: str = "", instructions: str = "") -> Skill:
    """Create a shared skill; 409 when the name (case-insensitive) is taken."""
    name = clean_name(name)
    description = clean_text(description, "description")
    instructions = clean_text(instructions, "instructions", PROMPT_MAX)
    await _ensure_skill_name_free(core, name)
    try:
        skill = await Skill.acreate(name=name, description=description, instructions=instructions)
    except IntegrityError:  # the unique name_key index: a concurrent create took the name
        raise _skill_name_taken(name) from None
    _invalidate(core)
    return skill


async def list_skills(core: Core) -> list[Skill]:
    return await core.db.list(Skill.select().order_by(Skill.created_at, Skill.id))


async def get_skill(core: Core, skill_id: str) -> Skill:
    skill = await Skill.aget_or_none(Skill.id == skill_id) if storable(skill_id) else None
    if skill is None:
        raise NotFoundError(f"No skill has the id '{skill_id}'.")
    return skill


async def update_skill(
    core: Core,
    *,
    skill_id: str,
    name: str = _UNSET,
    description: str = _UNSET,
    instructions: str = _UNSET,
) -> Skill:
    """Change the named fields; a rename carries the workers bound to the skill along."""
    async with core.write_transaction():
        skill = await get_skill(core, skill_id)
        old_name = skill.name
        if name is not _UNSET:
            skill.name = clean_name(name)
            await _ensure_skill_name_free(core, skill.name, except_id=skill.id)
        if description is not _UNSET:
            skill.description = clean_text(description, "description")
        if instructions is not _UNSET:
            skill.instructions = clean_text(instructions, "instructions", PROMPT_MAX)
        skill.updated_at = utcnow()
        try:
            await skill.asave()
        except IntegrityError:  # the unique name_key index: a concurrent rename took the name
            raise _skill_name_taken(skill.name) from None
        if skill.name != old_name:
            await core.db.aexecute(
                Worker.update(bound_skill=skill.name).where(Worker.bound_skill == old_name)
            )
    _invalidate(core)
    return skill


async def delete_skill(core: Core, *, skill_id: str) -> Skill:
    """Delete a skill no worker is bound to; 409 naming the workers otherwise."""
    async with core.write_transaction():
        skill = await get_skill(core, skill_id)
        workers = await core.db.list(
            Worker.select(Worker.id, Worker.name)
            .where(Worker.bound_skill == skill.name)
            .order_by(Worker.name)
        )
        if workers:
            names = ", ".join(f"'{w.name}'" for w in workers)
            raise ConflictError(
                f"Skill '{skill.name}' is bound by worker(s) {names}; unbind it first.",
                detail={"workers": [{"worker_id": w.id, "name": w.name} for w in workers]},
            )
        await core.db.aexecute(Skill.delete().where(Skill.id == skill.id))
    _invalidate(core)
    return skill


# --- workers -------------------------------------------------------------------------------------


def worker_view(worker: Worker, provider: Provider | None = None) -> dict[str, Any]:
    return {
        "worker_id": worker.id,
        "id": worker.id,
        "owner_id": worker.owner_id,
        "name": worker.name,
        "description": worker.description,
        "system_prompt": worker.system_prompt,
        "provider_id": worker.provider_id,
        "provider_name": provider.name if provider else None,
        "model": worker.model,
        "tools": list(worker.tools or []),
        "bound_skill": worker.bound_skill,
        "created_at": iso(worker.created_at),
        "updated_at": iso(worker.updated_at),
    }


async def worker_views(core: Core, workers: list[Worker]) -> list[dict[str, Any]]:
    providers = await _providers_by_id(core, {w.provider_id for w in workers})
    return [worker_view(w, providers.get(w.provider_id)) for w in workers]


async def _check_references(
    core: Core, *, provider_id: str = _UNSET, tools: list[str] = _UNSET, bound_skill: str | None = _UNSET
) -> tuple[list[str] | Any, str | None | Any]:
    """Check provider, tools and skill together; one 422 listing every unknown name.
    Returns (tools without duplicates, the skill's stored name)."""
    problems: list[dict[str, str]] = []
    if provider_id is not _UNSET and (
        not storable(provider_id) or await Provider.aget_or_none(Provider.id == provider_id) is None
    ):
        problems.append({"field": "provider_id", "problem": f"unknown provider '{provider_id}'"})
    if tools is not _UNSET:
        registry = tool_registry(core)
        await registry.load()
        tools = list(dict.fromkeys(tools))
        for index, name in enumerate(tools):
            if name not in registry:
                problems.append({
                    "field": f"tools.{index}",
                    "problem": f"unknown tool '{name}'; available: {', '.join(registry.names())}",
                })
    if bound_skill is not _UNSET and bound_skill is not None:
        rows = []
        if storable(bound_skill):
            rows = await core.db.list(Skill.select().where(Skill.name_key == name_key(bound_skill.strip())))
        if rows:
            bound_skill = rows[0].name
        else:
            problems.append({"field": "bound_skill", "problem": f"unknown skill '{bound_skill}'"})
    if problems:
        summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
        raise ValidationError(f"Unknown references: {summary}.", detail=problems)
    return tools, bound_skill


def _worker_name_taken(name: str) -> ConflictError:
    return ConflictError(f"You already have a worker named '{name}' (names ignore case).")


async def _ensure_worker_name_free(
    core: Core, owner_id: str, name: str, *, except_id: str | None = None
) -> None:
    """A friendly early 409; the unique (owner, name_key) index decides under races."""
    query = Worker.select(Worker.id).where(
        (Worker.owner == owner_id) & (Worker.name_key == name_key(name))
    )
    if except_id is not None:
        query = query.where(Worker.id != except_id)
    if await core.db.exists(query):
        raise _worker_name_taken(name)


async def _save_worker(core: Core, worker: Worker, *, create: bool) -> Worker:
    """Insert or update; an IntegrityError is the name index (409) or a provider deleted
    meanwhile (422): which one is read back from the store."""
    try:
        await worker.asave(force_insert=create)
    except IntegrityError:
        taken = Worker.select(Worker.id).where(
            (Worker.owner == worker.owner_id)
            & (Worker.name_key == name_key(worker.name))
            & (Worker.id != worker.id)
        )
        if await core.db.exists(taken):
            raise _worker_name_taken(worker.name) from None
        raise ValidationError.field("provider_id", f"unknown provider '{worker.provider_id}'") from None
    return worker


async def create_worker(
    core: Core,
    *,
    owner_id: str,
    name: str,
    provider_id: str,
    description: str = "",
    system_prompt: str = "",
    model: str | None = None,
    tools: list[str] = (),
    bound_skill: str | None = None,
) -> Worker:
    """Create one of the owner's workers; 422 naming any unknown provider, tool or skill."""
    name = clean_name(name)
    description = clean_text(description, "description")
    system_prompt = clean_text(system_prompt, "system_prompt", PROMPT_MAX)
    model = clean_model(model, "model") if model is not None else None
    await _ensure_worker_name_free(core, owner_id, name)
    tools, bound_skill = await _check_references(
        core, provider_id=provider_id, tools=list(tools), bound_skill=bound_skill
    )
    worker = Worker(
        owner=owner_id, name=name, description=description, system_prompt=system_prompt,
        provider=provider_id, model=model, tools=tools, bound_skill=bound_skill,
    )
    await _save_worker(core, worker, create=True)
    _invalidate(core)
    return worker


async def list_workers(
    core: Core, *, owner_id: str, limit: int = DEFAULT_LIMIT, cursor: str | None = None
) -> Page[Worker]:
    """A page of the owner's workers, oldest first."""
    return await keyset_page(
        core.db, Worker.select().where(Worker.owner == owner_id), kind="worker",
        at=Worker.created_at, key=Worker.id, limit=limit, cursor=cursor,
    )


async def get_worker(core: Core, *, owner_id: str, worker_id: str) -> Worker:
    """One of the owner's workers; another user's is 404, like a missing one."""
    worker = None
    if storable(worker_id):
        worker = await Worker.aget_or_none((Worker.id == worker_id) & (Worker.owner == owner_id))
    if worker is None:
        raise NotFoundError(f"You have no worker with the id '{worker_id}'.")
    return worker


async def update_worker(core: Core, *, owner_id: str, worker_id: str, **changes: Any) -> Worker:
    """Change the given fields (name, description, system_prompt, provider_id, model,
    tools, bound_skill); null model or bound_skill clears it."""
    allowed = {"name", "description", "system_prompt", "provider_id", "model", "tools", "bound_skill"}
    unknown = set(changes) - allowed
    if unknown:
        raise ValidationError.field(sorted(unknown)[0], "cannot be changed")
    worker = await get_worker(core, owner_id=owner_id, worker_id=worker_id)
    if "name" in changes:
        worker.name = clean_name(changes["name"])
        await _ensure_worker_name_free(core, owner_id, worker.name, except_id=worker.id)
    if "description" in changes:
        worker.description = clean_text(changes["description"], "description")
    if "system_prompt" in changes:
        worker.system_prompt = clean_text(changes["system_prompt"], "system_prompt", PROMPT_MAX)
    if "model" in changes:
        worker.model = clean_model(changes["model"], "model") if changes["model"] is not None else None
    tools, skill = await _check_references(
        core,
        provider_id=changes.get("provider_id", _UNSET),
        tools=list(changes["tools"]) if "tools" in changes else _UNSET,
        bound_skill=changes.get("bound_skill", _UNSET),
    )
    if "provider_id" in changes:
        worker.provider = changes["provider_id"]
    if tools is not _UNSET:
        worker.tools = tools
    if skill is not _UNSET:
        worker.bound_skill = skill
    worker.updated_at = utcnow()
    await _save_worker(core, worker, create=False)
    _invalidate(core)
    return worker


async def delete_worker(core: Core, *, owner_id: str, worker_id: str) -> Worker:
    worker = await get_worker(core, owner_id=owner_id, worker_id=worker_id)
    await core.db.aexecute(Worker.delete().where(Worker.id == worker.id))
    _invalidate(core)
    return worker


# --- system nodes -------------------------------------------------------------------------------


def _node_view(spec: NodeSpec, row: SystemNode | None, provider: Provider | None) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "provider": row.provider_id if row else None,
        "provider_name": provider.name if provider else None,
        "model": row.model if row else None,
        "tools": list(spec.tools),
        "updated_at": iso(row.updated_at) if row else None,
    }


async def list_nodes(core: Core) -> list[dict[str, Any]]:
    """The built-in nodes, in a fixed order, with their configured provider and model."""
    rows = {n.name: n for n in await core.db.list(SystemNode.select())}
    providers = await _providers_by_id(core, {n.provider_id for n in rows.values() if n.provider_id})
    return [
        _node_view(spec, rows.get(spec.name), providers.get(getattr(rows.get(spec.name), "provider_id", None)))
        for spec in NODE_SPECS.values()
    ]


def _node_spec(name: str) -> NodeSpec:
    spec = NODE_SPECS.get(name)
    if spec is None:
        raise NotFoundError(f"No system node is named '{name}'; there are {', '.join(NODE_SPECS)}.")
    return spec


async def get_node(core: Core, name: str) -> dict[str, Any]:
    spec = _node_spec(name)
    row = await SystemNode.aget_or_none(SystemNode.name == spec.name)
    provider = await Provider.aget_or_none(Provider.id == row.provider_id) if row and row.provider_id else None
    return _node_view(spec, row, provider)


async def update_node(core: Core, *, name: str, provider: str | None = _UNSET, model: str | None = _UNSET) -> dict[str, Any]:
    """Set a node's provider (an id; null clears) and/or model (null: the provider's model_id)."""
    spec = _node_spec(name)
    if provider is _UNSET and model is _UNSET:
        raise ValidationError.field("body", "send provider and/or model")
    if provider is not _UNSET and provider is not None and (
            not storable(provider) or await Provider.aget_or_none(Provider.id == provider) is None):
        raise ValidationError.field("provider", f"unknown provider '{provider}'")
    if model is not _UNSET and model is not None:
        model = clean_model(model, "model")
    values: dict[Any, Any] = {SystemNode.updated_at: utcnow()}
    if provider is not _UNSET:
        values[SystemNode.provider] = provider
    if model is not _UNSET:
        values[SystemNode.model] = model
    upsert = SystemNode.insert({SystemNode.name: spec.name, **values}).on_conflict(
        conflict_target=[SystemNode.name], update=values
    )
    try:
        await core.db.aexecute(upsert)
    except IntegrityError:  # the provider was deleted meanwhile
        raise ValidationError.field("provider", f"unknown provider '{provider}'") from None
    _invalidate(core)
    return await get_node(core, spec.name)
