"""Workers (SPEC §3): each belongs to its owner; another user's worker is simply not
found. A worker also belongs to a workspace (SPEC §16; default its owner's personal
one): in a team workspace its members read it and its editors change and delete it
(services/workspace_scope.py). Provider, tools and bound skill are checked together (one 422 naming every
unknown reference); a write drops the agent cache's copy (through `Caches`). A worker's
provider, and the MCP servers its tools come from, are its workspace's or instance-wide
ones: another workspace's read as an unknown provider or tool (SPEC §16: references
never cross workspaces).
"""

from __future__ import annotations

from typing import Any

from peewee import IntegrityError

from orchestra.db.models import Provider, Skill, Worker, iso, name_key, storable, utcnow
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.services import audit, workspace_scope
from orchestra.services.agents.skills import PROMPT_MAX
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page
from orchestra.services.personal_workspace import personal_workspace_id
from orchestra.services.providers import (
    clean_model,
    clean_name,
    clean_text,
    providers_by_id,
    usable_by,
)
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action

_UNSET: Any = object()


def worker_view(worker: Worker, provider: Provider | None = None) -> dict[str, Any]:
    return {
        "worker_id": worker.id,
        "id": worker.id,
        "owner_id": worker.owner_id,
        "workspace_id": worker.workspace_id,
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


async def worker_views(core: Shared, workers: list[Worker]) -> list[dict[str, Any]]:
    providers = await providers_by_id(core, {w.provider_id for w in workers})
    return [worker_view(w, providers.get(w.provider_id)) for w in workers]


def unknown_provider(provider_id: str) -> str:
    """The problem of a provider a worker may not use: one that does not exist and one of
    another workspace read alike (nothing tells which ids exist elsewhere)."""
    return (f"unknown provider '{provider_id}' (a worker uses a provider of its own workspace "
            "or an instance-wide one)")


async def _check_references(
    core: Shared, *, workspace_id: str | None, provider_id: str = _UNSET, tools: list[str] = _UNSET,
    bound_skill: str | None = _UNSET,
) -> tuple[list[str] | Any, str | None | Any]:
    """Check provider and tools (each `workspace_id`'s or an instance-wide one: another
    workspace's MCP server's tools are unknown here) and skill together; one 422 listing
    every unknown name. Returns (tools without duplicates, the skill's stored name)."""
    problems: list[dict[str, str]] = []
    if provider_id is not _UNSET and (
        not storable(provider_id)
        or await Provider.aget_or_none((Provider.id == provider_id) & usable_by(workspace_id)) is None
    ):
        problems.append({"field": "provider_id", "problem": unknown_provider(provider_id)})
    if tools is not _UNSET:
        registry = core.tool_registry
        await registry.load()
        tools = list(dict.fromkeys(tools))
        for index, name in enumerate(tools):
            if not registry.has(name, workspace_id):
                problems.append({
                    "field": f"tools.{index}",
                    "problem": f"unknown tool '{name}'; available: {', '.join(registry.names(workspace_id))}",
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
    core: Shared, owner_id: str, name: str, *, except_id: str | None = None
) -> None:
    """A friendly early 409; the unique (owner, name_key) index decides under races."""
    query = Worker.select(Worker.id).where(
        (Worker.owner == owner_id) & (Worker.name_key == name_key(name))
    )
    if except_id is not None:
        query = query.where(Worker.id != except_id)
    if await core.db.exists(query):
        raise _worker_name_taken(name)


def audited_fields(worker: Worker) -> dict[str, Any]:
    """What an audit entry shows of a worker's change (SPEC §16)."""
    return {"name": worker.name, "description": worker.description, "system_prompt": worker.system_prompt,
            "provider_id": worker.provider_id, "model": worker.model, "tools": list(worker.tools or []),
            "bound_skill": worker.bound_skill}


async def _save_worker(core: Shared, worker: Worker, *, create: bool, before: dict[str, Any]) -> Worker:
    """Insert or update, with its audit entry in the same transaction (SPEC §16); an
    IntegrityError is the name index (409) or a provider deleted meanwhile (422): which
    one is read back from the store, once the transaction is rolled back."""
    try:
        async with core.write_transaction():
            saved = await worker.asave(force_insert=create)
            if not create and not saved:  # deleted meanwhile: no change, no entry
                raise NotFoundError(f"You have no worker with the id '{worker.id}'.")
            await audit.record(core, action="worker.create" if create else "worker.update",
                               target=audit.target("worker", worker.id, worker.name),
                               changes=audit.diff(before, audited_fields(worker)),
                               workspace_id=audit.workspace_of(worker))
    except IntegrityError:
        taken = Worker.select(Worker.id).where(
            (Worker.owner == worker.owner_id)
            & (Worker.name_key == name_key(worker.name))
            & (Worker.id != worker.id)
        )
        if await core.db.exists(taken):
            raise _worker_name_taken(worker.name) from None
        raise ValidationError.field("provider_id", unknown_provider(worker.provider_id)) from None
    return worker


async def create_worker(
    core: Shared,
    *,
    owner_id: str,
    name: str,
    provider_id: str,
    description: str = "",
    system_prompt: str = "",
    model: str | None = None,
    tools: list[str] = (),
    bound_skill: str | None = None,
    workspace_id: str | None = None,
) -> Worker:
    """Create one of the owner's workers in `workspace_id` (an editor's there; default the
    owner's personal one); 422 naming any unknown provider, tool or skill."""
    workspace_id = await workspace_scope.target(core, owner_id, workspace_id, Action.EDIT)
    name = clean_name(name)
    description = clean_text(description, "description")
    system_prompt = clean_text(system_prompt, "system_prompt", PROMPT_MAX)
    model = clean_model(model, "model") if model is not None else None
    await _ensure_worker_name_free(core, owner_id, name)
    tools, bound_skill = await _check_references(
        core, workspace_id=workspace_id, provider_id=provider_id, tools=list(tools), bound_skill=bound_skill
    )
    worker = Worker(
        owner=owner_id, name=name, description=description, system_prompt=system_prompt,
        provider=provider_id, model=model, tools=tools, bound_skill=bound_skill,
        workspace_id=workspace_id,
    )
    await _save_worker(core, worker, create=True, before={})
    core.caches.changed("worker")
    return worker


async def list_workers(
    core: Shared, *, owner_id: str, limit: int = DEFAULT_LIMIT, cursor: str | None = None,
    workspace_id: str | None = None,
) -> Page[Worker]:
    """A page of the owner's workers and their team workspaces', oldest first
    (`workspace_id`: that workspace's only; 404 for a non-member)."""
    where = await workspace_scope.owned_where(core, owner_id, workspace_id, Worker.owner, Worker.workspace_id)
    return await keyset_page(
        core.db, Worker.select().where(where), kind="worker",
        at=Worker.created_at, key=Worker.id, limit=limit, cursor=cursor,
    )


async def get_worker(core: Shared, *, owner_id: str, worker_id: str, action: Action = Action.READ) -> Worker:
    """One of the caller's workers, or one of a team workspace by the caller's role there
    (`action` edit: change, delete; 403 below it); another user's is 404, like a missing one."""
    worker = None
    if storable(worker_id) and len(worker_id) <= 36:
        worker = await Worker.aget_or_none(Worker.id == worker_id)
    missing = NotFoundError(f"You have no worker with the id '{worker_id}'.")
    if worker is None:
        raise missing
    await workspace_scope.check_owned(core, owner_id, worker.owner_id, worker.workspace_id, action, missing)
    return worker


async def update_worker(core: Shared, *, owner_id: str, worker_id: str, **changes: Any) -> Worker:
    """Change the given fields (name, description, system_prompt, provider_id, model,
    tools, bound_skill); null model or bound_skill clears it."""
    allowed = {"name", "description", "system_prompt", "provider_id", "model", "tools", "bound_skill"}
    unknown = set(changes) - allowed
    if unknown:
        raise ValidationError.field(min(unknown), "cannot be changed")
    worker = await get_worker(core, owner_id=owner_id, worker_id=worker_id, action=Action.EDIT)
    before = audited_fields(worker)
    if "name" in changes:
        worker.name = clean_name(changes["name"])
        await _ensure_worker_name_free(core, worker.owner_id, worker.name, except_id=worker.id)
    if "description" in changes:
        worker.description = clean_text(changes["description"], "description")
    if "system_prompt" in changes:
        worker.system_prompt = clean_text(changes["system_prompt"], "system_prompt", PROMPT_MAX)
    if "model" in changes:
        worker.model = clean_model(changes["model"], "model") if changes["model"] is not None else None
    tools, skill = await _check_references(
        core,
        workspace_id=worker.workspace_id or await personal_workspace_id(core, worker.owner_id),
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
    await _save_worker(core, worker, create=False, before=before)
    core.caches.changed("worker")
    return worker


async def delete_worker(core: Shared, *, owner_id: str, worker_id: str) -> Worker:
    worker = await get_worker(core, owner_id=owner_id, worker_id=worker_id, action=Action.EDIT)
    async with core.write_transaction():
        if await core.db.aexecute(Worker.delete().where(Worker.id == worker.id)):
            await audit.record(core, action="worker.delete", target=audit.target("worker", worker.id, worker.name),
                               changes=audit.diff(audited_fields(worker), {}),
                               workspace_id=audit.workspace_of(worker))
    core.caches.changed("worker")
    return worker


