"""Template versions (SPEC §13): list, read, diff and restore.

Every save makes a version (`version_store`); these read them. Access is the
template's: whoever may read the template may read its versions, whoever may change it
may restore one. A list reads no content (its `step_count` is stored), and a diff reads
the two versions it compares, so a template with a thousand versions costs the same.
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import TemplateVersion, WorkflowTemplate, iso
from orchestra.services import template_diff, templates, version_store
from orchestra.services.shared import Shared


def summary(row: TemplateVersion) -> dict[str, Any]:
    return {"version": row.version, "created_at": iso(row.created_at), "author_id": row.author_id,
            "step_count": row.step_count}


def summaries(rows: list[tuple]) -> list[dict[str, Any]]:
    """`list_versions`' rows (plain tuples: a thousand need no model objects) as answers."""
    return [{"version": version, "created_at": iso(created_at), "author_id": author_id, "step_count": steps}
            for version, created_at, author_id, steps in rows]


def version_view(template: WorkflowTemplate, row: TemplateVersion) -> dict[str, Any]:
    """A version with its content, shaped like a template."""
    return {**summary(row), "template_id": template.id, "name": row.name,
            "description": row.description or "", "steps": row.steps, **(row.spec or {})}


async def list_versions(core: Shared, *, user_id: str, is_admin: bool, template_id: str) -> list[dict[str, Any]]:
    """Every version of a template the caller may read, newest first (no content)."""
    template = await templates.get_template(core, user_id=user_id, is_admin=is_admin, template_id=template_id)
    fields = (TemplateVersion.version, TemplateVersion.created_at, TemplateVersion.author,
              TemplateVersion.step_count)
    return summaries(await core.db.list(TemplateVersion.select(*fields)
                                        .where(TemplateVersion.template == template.id)
                                        .order_by(TemplateVersion.version.desc()).tuples()))


async def read_version(core: Shared, *, user_id: str, is_admin: bool, template_id: str,
                       number: int) -> tuple[WorkflowTemplate, TemplateVersion]:
    template = await templates.get_template(core, user_id=user_id, is_admin=is_admin, template_id=template_id)
    return template, await version_store.read(core, template, number)


async def diff_versions(core: Shared, *, user_id: str, is_admin: bool, template_id: str,
                        from_version: int | None, to_version: int | None) -> dict[str, Any]:
    """The structural diff from one version to another (default: the latest, and the
    one before it); 404 for an unknown version."""
    template = await templates.get_template(core, user_id=user_id, is_admin=is_admin, template_id=template_id)
    to_version = template.version if to_version is None else to_version
    from_version = max(1, to_version - 1) if from_version is None else from_version
    old = await version_store.read(core, template, from_version)
    new = old if to_version == from_version else await version_store.read(core, template, to_version)
    return {"template_id": template.id, "from": from_version, "to": to_version,
            **template_diff.diff(version_store.content(old), version_store.content(new))}


async def restore(core: Shared, *, user_id: str, is_admin: bool, template_id: str,
                  number: int) -> WorkflowTemplate:
    """Save version `number`'s content as the newest version (checked like any save:
    a worker since deleted is a 422, a name since taken a 409; then no version is made)."""
    template = await templates.get_template(core, user_id=user_id, is_admin=is_admin,
                                            template_id=template_id, write=True)
    row = await version_store.read(core, template, number)
    return await templates.update_template(
        core, user_id=user_id, is_admin=is_admin, template_id=template.id, name=row.name,
        description=row.description or "", steps=row.steps, options=dict(row.spec or {}),
        restored_from=number,
    )
