"""Who may do what in a workspace (SPEC §16): the one table of roles and rights.

Roles are ordered, each with the rights of those after it: owner > admin > editor >
runner > viewer. `RIGHTS` names, for every action, the least role that has it;
`require` is what every handler's service calls before it acts in a workspace:

- a workspace the caller is not a member of is not found (404, never 403: its
  existence is not told);
- a member whose role is below the action's gets 403 `PermissionDeniedError` naming the
  least role that has the right (`detail.role_needed`);
- a SUPER_ADMINISTRATOR acts in every workspace as its owner.

No handler or service decides a workspace right on its own: they ask `require` (or
`allows`, for a role already read).

A request made with an API key reaches one workspace only, the key's (SPEC §16): the web
layer binds it (`bind_key_reach`, from `web/auth.py`'s `protected`, at every request) and
`access` here, like services/workspace_scope.py's `target`, `listed` and `resource_team`,
answers 404 for any other workspace. The key's scopes are narrowed by its user's role in
that workspace at the moment of use (`SCOPE_ACTIONS`, asked by `protected`).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from orchestra.db.models import storable
from orchestra.db.workspace_models import Workspace, WorkspaceMember
from orchestra.errors import NotFoundError, PermissionDeniedError
from orchestra.services.roles import Role
from orchestra.services.shared import Shared


class WorkspaceRole(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    EDITOR = "editor"
    RUNNER = "runner"
    VIEWER = "viewer"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def at_least(self, other: WorkspaceRole) -> bool:
        return self.rank >= other.rank


_RANK = {WorkspaceRole.VIEWER: 0, WorkspaceRole.RUNNER: 1, WorkspaceRole.EDITOR: 2,
         WorkspaceRole.ADMIN: 3, WorkspaceRole.OWNER: 4}

#: Role names, highest first (as the API lists them).
WORKSPACE_ROLES = [role.value for role in sorted(WorkspaceRole, key=lambda r: -r.rank)]


class Action(StrEnum):
    """What a caller may ask to do inside a workspace."""

    READ = "read"                      # the workspace, its members, templates, runs, events, usage
    RUN = "run"                        # start, answer, cancel, retry and fork runs; top-ups
    EDIT = "edit"                      # templates, workers, schedules, hooks, subscriptions: create, change, delete, restore
    MANAGE = "manage"                  # the workspace's name and limits; members below owner; secrets, keys, audit
    MANAGE_OWNERS = "manage_owners"    # grant or remove `owner`
    DELETE = "delete"                  # delete the workspace


#: The least role that has each right.
RIGHTS: dict[Action, WorkspaceRole] = {
    Action.READ: WorkspaceRole.VIEWER,
    Action.RUN: WorkspaceRole.RUNNER,
    Action.EDIT: WorkspaceRole.EDITOR,
    Action.MANAGE: WorkspaceRole.ADMIN,
    Action.MANAGE_OWNERS: WorkspaceRole.OWNER,
    Action.DELETE: WorkspaceRole.OWNER,
}

#: Words for the actions in a refusal ("… needs the role 'editor' …").
_WORDS = {
    Action.READ: "reading this workspace",
    Action.RUN: "running, answering, cancelling, retrying or forking runs",
    Action.EDIT: "changing templates, workers, schedules and hooks",
    Action.MANAGE: "managing the workspace and its members",
    Action.MANAGE_OWNERS: "granting or removing the role 'owner'",
    Action.DELETE: "deleting the workspace",
}


#: The right each API key scope (SPEC §11) acts with in the key's workspace: a key's
#: scope is worth no more than its user's role there at the moment of use.
SCOPE_ACTIONS: dict[str, Action] = {
    "run:start": Action.RUN,
    "run:read": Action.READ,
    "run:reply": Action.RUN,
    "run:cancel": Action.RUN,
    "template:read": Action.READ,
    "template:write": Action.EDIT,
}


class Caller(Protocol):
    """Who acts: a user id and the instance role in force (the web's Principal is one)."""

    user_id: str
    role: Role


@dataclass(frozen=True)
class Access:
    """A workspace and the caller's role in it (a SUPER_ADMINISTRATOR's: at least owner).
    `member`: whether the caller is a member (a SUPER_ADMINISTRATOR may not be)."""

    workspace: Workspace
    role: WorkspaceRole
    member: bool


@dataclass(frozen=True, slots=True)
class KeyReach:
    """The one workspace a request made with an API key reaches: the key's (`personal`:
    its user's personal workspace, whose resources are that user's own, SPEC §3)."""

    workspace_id: str
    user_id: str
    personal: bool


_key_reach: ContextVar[KeyReach | None] = ContextVar("orchestra_key_reach", default=None)


def bind_key_reach(reach: KeyReach | None) -> None:
    """The current request's key workspace (None: not a key's request). Bound at every
    request's start and again once it is authenticated (a request's task is reused by
    the next request of its connection, an MCP session's by its later requests)."""
    _key_reach.set(reach)


def key_reach() -> KeyReach | None:
    return _key_reach.get()


def within_key(workspace_id: str | None) -> str | None:
    """The workspace a body's or a query's `workspace_id` names, for a key's request: the
    key's when none is named, 404 for any other; unchanged for every other request."""
    reach = _key_reach.get()
    if reach is None:
        return workspace_id
    if workspace_id is None:
        return reach.workspace_id
    if workspace_id != reach.workspace_id:
        raise not_found(workspace_id)
    return workspace_id


def allows(role: WorkspaceRole | str, action: Action) -> bool:
    return WorkspaceRole(role).at_least(RIGHTS[action])


def refusal(role: WorkspaceRole | str, action: Action, name: str) -> PermissionDeniedError:
    needed = RIGHTS[action]
    return PermissionDeniedError(
        f"{_WORDS[action].capitalize()} needs the role '{needed}' or above in the workspace "
        f"'{name}' (yours: '{role}').", detail={"role_needed": needed.value, "role": str(role)})


def not_found(workspace_id: str) -> NotFoundError:
    return NotFoundError(f"No workspace has the id '{workspace_id[:80]}'.")


async def member_role(core: Shared, workspace_id: str, user_id: str) -> WorkspaceRole | None:
    row = await WorkspaceMember.aget_or_none((WorkspaceMember.workspace == workspace_id)
                                             & (WorkspaceMember.user == user_id))
    return WorkspaceRole(row.role) if row is not None else None


async def access(core: Shared, user: Caller, workspace_id: str) -> Access:
    """The workspace and the caller's role there; 404 for an unknown one or a non-member
    (a SUPER_ADMINISTRATOR is the owner of every workspace); 404 too for any workspace
    but an API key's own, for a key's request."""
    within_key(workspace_id)
    workspace = None
    if len(workspace_id) <= 36 and storable(workspace_id):
        workspace = await Workspace.aget_or_none(Workspace.id == workspace_id)
    if workspace is None:
        raise not_found(workspace_id)
    role = await member_role(core, workspace.id, user.user_id)
    if Role(user.role) == Role.SUPER_ADMINISTRATOR:
        return Access(workspace, WorkspaceRole.OWNER, role is not None)
    if role is None:
        raise not_found(workspace_id)
    return Access(workspace, role, True)


async def require(core: Shared, user: Caller, workspace_id: str, action: Action) -> Access:
    """`access`, then 403 naming the least role with the right when the caller's is below."""
    found = await access(core, user, workspace_id)
    if not allows(found.role, action):
        raise refusal(found.role, action, found.workspace.name)
    return found


async def instance_or_workspace(core: Shared, user: Caller, workspace_id: str | None,
                                action: Action = Action.MANAGE) -> str | None:
    """Where a caller acts on resources that are instance-wide or a workspace's own
    (providers, MCP servers; SPEC §16): `workspace_id`'s (`require`: 404 for a non-member,
    403 naming the least role below `action`'s), else the instance-wide ones, which only
    ADMINISTRATOR and above change (403 else) and every user reads (`Action.READ`)."""
    if workspace_id is None:
        if action != Action.READ and Role(user.role).rank < Role.ADMINISTRATOR.rank:
            raise PermissionDeniedError(f"This operation needs the role {Role.ADMINISTRATOR.value} or above "
                                        "(or admin in the workspace named by workspace_id).")
        return None
    found = await require(core, user, workspace_id, action)
    return found.workspace.id


EVERY_SCOPE: Any = object()  # a lookup of an instance-wide-or-workspace resource in any scope


def of_scope(column: Any, workspace_id: str | None) -> Any:
    """The rows of one scope: `workspace_id`'s own, or (None) the instance-wide ones."""
    return column.is_null() if workspace_id is None else column == workspace_id


async def one_in_scope(model: Any, row_id: str, workspace_id: str | None, noun: str) -> Any:
    """The row of `model` with that id (a provider, an MCP server); given `workspace_id`
    (not `EVERY_SCOPE`), only one of that scope (None: instance-wide): any other is 404
    naming `noun`, like a missing one."""
    row = None
    if storable(row_id) and len(row_id) <= 36:
        where = model.id == row_id
        if workspace_id is not EVERY_SCOPE:
            where = where & of_scope(model.workspace_id, workspace_id)
        row = await model.aget_or_none(where)
    if row is None:
        in_ws = " in this workspace" if workspace_id is not EVERY_SCOPE and workspace_id else ""
        raise NotFoundError(f"No {noun} has the id '{row_id[:80]}'{in_ws}.")
    return row


async def member_workspaces(core: Shared, user_id: str) -> dict[str, WorkspaceRole]:
    """The workspaces the user is a member of, with the user's role in each."""
    rows = await core.db.list(WorkspaceMember.select(WorkspaceMember.workspace, WorkspaceMember.role)
                              .where(WorkspaceMember.user == user_id))
    return {row.workspace_id: WorkspaceRole(row.role) for row in rows}
