"""Every user's personal workspace (SPEC §16): made with the user (services/auth.py's
`register`), or on first need for a user stored without one; never shared, deleted with
the user (the store's `ON DELETE CASCADE`)."""

from __future__ import annotations

from peewee import IntegrityError

from orchestra.db.models import User
from orchestra.db.workspace_models import Workspace, WorkspaceMember
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import WorkspaceRole


async def personal_workspace(core: Shared, user_id: str, user_name: str | None = None) -> Workspace:
    """The user's personal workspace, made now when the user has none yet."""
    found = await Workspace.aget_or_none(Workspace.personal_user == user_id)
    if found is not None:
        return found
    if user_name is None:
        user = await User.aget_or_none(User.id == user_id)
        user_name = user.user_name if user is not None else user_id
    try:
        async with core.db.atomic():
            made = await Workspace.acreate(name=user_name, personal=True, personal_user=user_id)
            await WorkspaceMember.acreate(workspace=made.id, user=user_id, role=WorkspaceRole.OWNER.value)
    except IntegrityError:  # a concurrent first need made it
        return await Workspace.aget(Workspace.personal_user == user_id)
    return made


async def personal_workspace_id(core: Shared, user_id: str) -> str:
    return (await personal_workspace(core, user_id)).id
