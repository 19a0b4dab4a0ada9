"""Skills (SPEC §3): shared instructions a worker may bind; administrators manage them.

A write drops the agent cache's copy (through `Caches`); a rename carries the workers
bound to the skill along.
"""

from __future__ import annotations

from typing import Any

from peewee import IntegrityError

from orchestra.db.models import Skill, Worker, iso, name_key, storable, utcnow
from orchestra.errors import ConflictError, NotFoundError
from orchestra.services import audit
from orchestra.services.providers import clean_name, clean_text
from orchestra.services.shared import Shared

PROMPT_MAX = 100_000  # characters of a skill's instructions or a worker's system prompt

_UNSET: Any = object()


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


def audited_fields(skill: Skill) -> dict[str, Any]:
    """What an audit entry shows of a skill's change (SPEC §16; instance-level)."""
    return {"name": skill.name, "description": skill.description, "instructions": skill.instructions}


def _target(skill: Skill) -> dict[str, Any]:
    return audit.target("skill", skill.id, skill.name)


def _skill_name_taken(name: str) -> ConflictError:
    return ConflictError(f"A skill named '{name}' already exists (names ignore case).")


async def _ensure_skill_name_free(core: Shared, name: str, *, except_id: str | None = None) -> None:
    """A friendly early 409; the unique index on `name_key` is what decides under races."""
    query = Skill.select(Skill.id).where(Skill.name_key == name_key(name))
    if except_id is not None:
        query = query.where(Skill.id != except_id)
    if await core.db.exists(query):
        raise _skill_name_taken(name)


async def create_skill(core: Shared, *, name: str, description: str = "", instructions: str = "") -> Skill:
    """Create a shared skill; 409 when the name (case-insensitive) is taken."""
    name = clean_name(name)
    description = clean_text(description, "description")
    instructions = clean_text(instructions, "instructions", PROMPT_MAX)
    await _ensure_skill_name_free(core, name)
    try:
        async with core.write_transaction():
            skill = await Skill.acreate(name=name, description=description, instructions=instructions)
            await audit.record(core, action="skill.create", target=_target(skill),
                               changes=audit.diff({}, audited_fields(skill)))
    except IntegrityError:  # the unique name_key index: a concurrent create took the name
        raise _skill_name_taken(name) from None
    core.caches.changed("skill")
    return skill


async def list_skills(core: Shared) -> list[Skill]:
    return await core.db.list(Skill.select().order_by(Skill.created_at, Skill.id))


async def get_skill(core: Shared, skill_id: str) -> Skill:
    skill = await Skill.aget_or_none(Skill.id == skill_id) if storable(skill_id) else None
    if skill is None:
        raise NotFoundError(f"No skill has the id '{skill_id}'.")
    return skill


async def update_skill(
    core: Shared,
    *,
    skill_id: str,
    name: str = _UNSET,
    description: str = _UNSET,
    instructions: str = _UNSET,
) -> Skill:
    """Change the named fields; a rename carries the workers bound to the skill along."""
    async with core.write_transaction():
        skill = await get_skill(core, skill_id)
        old_name, before = skill.name, audited_fields(skill)
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
        await audit.record(core, action="skill.update", target=_target(skill),
                           changes=audit.diff(before, audited_fields(skill)))
    core.caches.changed("skill")
    return skill


async def delete_skill(core: Shared, *, skill_id: str) -> Skill:
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
        await audit.record(core, action="skill.delete", target=_target(skill),
                           changes=audit.diff(audited_fields(skill), {}))
    core.caches.changed("skill")
    return skill
