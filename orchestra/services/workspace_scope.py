"""Templates and runs inside workspaces (SPEC §16): which workspace a new one goes to,
which ones a list covers, and the check a read or an act passes in a team workspace.

A personal workspace keeps the per-user rules of SPEC §3, §4 and §15b (services/templates.py
and services/runs.py apply them, unchanged); a team workspace's templates and runs are
its members', by role, as services/workspace_rights.py says. Resources stored without a
workspace (before migration 0019 they all were) count as their owner's personal ones.

A request made with an API key reaches its key's workspace only (SPEC §16,
`workspace_rights.KeyReach`, bound by the web layer): `target` and `listed` take the
key's workspace for the one named (another one is 404), and every read or act on a
stored resource passes `resource_team`, which answers the resource's `missing` (404) for
one of another workspace. Handlers and services need not know whether a key is in use.
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import User, storable
from orchestra.db.workspace_models import Workspace
from orchestra.errors import OrchestraError
from orchestra.services.personal_workspace import personal_workspace_id
from orchestra.services.roles import Role
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import (
    Action,
    WorkspaceRole,
    allows,
    key_reach,
    member_role,
    member_workspaces,
    not_found,
    refusal,
    within_key,
)


async def team(core: Shared, workspace_id: str | None) -> Workspace | None:
    """The team workspace of that id; None for no workspace or a personal one."""
    if workspace_id is None:
        return None
    workspace = await Workspace.aget_or_none(Workspace.id == workspace_id)
    return workspace if workspace is not None and not workspace.personal else None


async def resource_team(core: Shared, workspace_id: str | None, owner_id: str | None,
                        missing: OrchestraError, *, shared: bool = False) -> Workspace | None:
    """`team` of a stored resource (its `workspace_id` and owner), after the check every
    read or act on one passes for a request made with an API key: the resource is of the
    key's workspace, else `missing` (a 404: another workspace's resources are not told,
    even where the key's user is a member). In a personal workspace (or none) a resource
    is its owner's: the key of the owner's personal workspace reaches it. `shared`: a
    shared template, every workspace's (SPEC §16)."""
    workspace = await team(core, workspace_id)
    reach = key_reach()
    if reach is not None and not shared:
        if workspace is not None:
            reached = workspace.id == reach.workspace_id
        else:
            reached = reach.personal and (workspace_id == reach.workspace_id or owner_id == reach.user_id)
        if not reached:
            raise missing
    return workspace


async def role_in(core: Shared, user_id: str, workspace_id: str) -> WorkspaceRole | None:
    """The user's role in a workspace (a SUPER_ADMINISTRATOR's: owner); None: none."""
    role = await member_role(core, workspace_id, user_id)
    if role == WorkspaceRole.OWNER:
        return role
    user = await User.aget_or_none(User.id == user_id)
    if user is not None and user.role == Role.SUPER_ADMINISTRATOR.value:
        return WorkspaceRole.OWNER
    return role


async def require_in(core: Shared, user_id: str, workspace: Workspace, action: Action,
                     missing: OrchestraError) -> WorkspaceRole:
    """`missing` (a 404) for a non-member, or for any workspace but an API key's own in a
    key's request; 403 naming the least role for a member below it."""
    reach = key_reach()
    if reach is not None and reach.workspace_id != workspace.id:
        raise missing
    role = await role_in(core, user_id, workspace.id)
    if role is None:
        raise missing
    if not allows(role, action):
        raise refusal(role, action, workspace.name)
    return role


async def target(core: Shared, user_id: str, workspace_id: str | None, action: Action) -> str:
    """The workspace a new resource goes to: the one named (404 unless the caller is a
    member: a personal one only its user's; 403 below `action`'s role), else the caller's
    personal workspace. For a key's request: the key's workspace (another one: 404)."""
    workspace_id = within_key(workspace_id)
    if workspace_id is None:
        return await personal_workspace_id(core, user_id)
    workspace = None
    if len(workspace_id) <= 36 and storable(workspace_id):
        workspace = await Workspace.aget_or_none(Workspace.id == workspace_id)
    if workspace is None or (workspace.personal and workspace.personal_user_id != user_id):
        raise not_found(workspace_id)
    if not workspace.personal:
        await require_in(core, user_id, workspace, action, not_found(workspace_id))
    return workspace.id


async def listed(core: Shared, user_id: str, workspace_id: str | None) -> tuple[bool, list[str]]:
    """What a list covers: `(personal, team ids)`. With `workspace_id` (404 unless the
    caller is a member): that one alone, `(True, [])` for the caller's personal one;
    without: the caller's own resources and every team workspace they are a member of.
    A key's request lists its key's workspace only (services apply `within_key` to their
    own `workspace_id` first, to branch as this does)."""
    workspace_id = within_key(workspace_id)
    if workspace_id is None:
        roles = await member_workspaces(core, user_id)
        teams = [w.id for w in await core.db.list(Workspace.select(Workspace.id).where(
            Workspace.id.in_(list(roles)) & (Workspace.personal == False)))]  # noqa: E712
        return True, teams
    mine = await target(core, user_id, workspace_id, Action.READ)
    workspace = await Workspace.aget(Workspace.id == mine)
    return (True, []) if workspace.personal else (False, [workspace.id])


async def hidden_teams(core: Shared, user_id: str) -> list[str]:
    """Team workspaces the user is not a member of (an ADMINISTRATOR's `all=true` list
    leaves their runs out); none for a SUPER_ADMINISTRATOR."""
    if await role_in(core, user_id, "") == WorkspaceRole.OWNER:  # a SUPER_ADMINISTRATOR
        return []
    roles = await member_workspaces(core, user_id)
    return [w.id for w in await core.db.list(Workspace.select(Workspace.id).where(
        (Workspace.personal == False) & Workspace.id.not_in(list(roles) or [""])))]  # noqa: E712


# --- resources with an owner: workers, schedules, hooks, keys, subscriptions -----------


async def owned_where(core: Shared, user_id: str, workspace_id: str | None, owner: Any,
                      column: Any) -> Any:
    """A list's condition on an owned resource (`owner`, `column`: its owner and
    workspace_id columns): without `workspace_id`, the caller's own and those of every
    team workspace they are a member of; with it, that workspace's only (404 for a
    non-member; the caller's own for their personal one); a key's request, its key's."""
    workspace_id = within_key(workspace_id)
    personal, teams = await listed(core, user_id, workspace_id)
    mine = owner == user_id
    if workspace_id is None:
        return mine | column.in_(teams) if teams else mine
    if personal:
        return mine & ((column == workspace_id) | column.is_null())
    return column == teams[0]


async def check_owned(core: Shared, user_id: str, owner_id: str, workspace_id: str | None,
                      action: Action, missing: OrchestraError) -> None:
    """A read (`Action.READ`) or a change of an owned resource: in a team workspace the
    caller's role there decides (`missing` for a non-member, 403 below `action`'s role);
    elsewhere the owner alone; a key's request reaches its key's workspace only."""
    workspace = await resource_team(core, workspace_id, owner_id, missing)
    if workspace is not None:
        await require_in(core, user_id, workspace, action, missing)
    elif owner_id != user_id:
        raise missing


async def workspace_of_template(core: Shared, template: Any) -> str | None:
    """The workspace a template belongs to (one stored before 0019: its owner's personal)."""
    if template.workspace_id is not None:
        return template.workspace_id
    return await personal_workspace_id(core, template.owner_id)


async def in_workspace(core: Shared, owner_id: str, workspace_id: str | None, owner: Any,
                       column: Any) -> tuple[Any, Workspace | None]:
    """What a resource of `workspace_id` may name among owned resources (`owner`,
    `column`: their owner and workspace_id columns; SPEC §16: references never cross
    workspaces), as a condition, and the workspace when it is a team one: a team
    workspace's own, whoever made them; a personal workspace's (no workspace: those of
    `owner_id`'s), its user's stored there or before workspaces (NULL)."""
    workspace = await Workspace.aget_or_none(Workspace.id == workspace_id) if workspace_id else None
    if workspace is not None and not workspace.personal:
        return column == workspace.id, workspace
    user_id = workspace.personal_user_id if workspace is not None else owner_id
    personal_id = workspace.id if workspace is not None else await personal_workspace_id(core, owner_id)
    return (owner == user_id) & ((column == personal_id) | column.is_null()), None
