"""Workspaces and their members (SPEC §16): create, list, read, change, delete; add,
list, change and remove members. What each role may do is services/workspace_rights.py,
asked through `require` before every act.

Rules kept here: a personal workspace is never shared (a member add is 409) nor deleted
(409); a workspace is not deleted while it holds active runs or enabled schedules (409);
only an owner grants or removes `owner`; the last owner can neither leave nor be demoted
(409 `ConflictError`); any member may leave (remove themselves).
"""

from __future__ import annotations

from typing import Any

from peewee import IntegrityError

from orchestra.db.models import User, WorkflowRun, iso
from orchestra.db.trigger_models import WorkflowSchedule
from orchestra.db.workspace_models import Workspace, WorkspaceMember
from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.money.amounts import parse_usd, read_usd, usd_text
from orchestra.services import audit, auth
from orchestra.services.personal_workspace import personal_workspace
from orchestra.services.providers import clean_name
from orchestra.services.roles import Role
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import (
    WORKSPACE_ROLES,
    Access,
    Action,
    Caller,
    WorkspaceRole,
    access,
    allows,
    member_workspaces,
    refusal,
    require,
)
from orchestra.vocabulary import ACTIVE

NAME_MAX = 128
ON_BUDGET = ("fail", "pause")
LIMIT_FIELDS = ("monthly_budget_usd", "on_budget")


# --- views ---------------------------------------------------------------------------------


def limits_view(limits: dict[str, Any] | None) -> dict[str, Any]:
    limits = limits or {}
    return {"monthly_budget_usd": limits.get("monthly_budget_usd"),
            "on_budget": limits.get("on_budget") or "fail"}


def workspace_view(workspace: Workspace, role: WorkspaceRole | str) -> dict[str, Any]:
    return {
        "workspace_id": workspace.id,
        "name": workspace.name,
        "personal": bool(workspace.personal),
        "role": str(role),
        "limits": limits_view(workspace.limits),
        "created_at": iso(workspace.created_at),
    }


# --- field rules ---------------------------------------------------------------------------


def clean_limits(value: Any) -> dict[str, Any] | None:
    """`limits` as stored: `{monthly_budget_usd: "decimal text" | null, on_budget}`; 422
    naming `limits.<field>`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationError.field("limits", "must be an object {monthly_budget_usd, on_budget}")
    for key in value:
        if key not in LIMIT_FIELDS:
            raise ValidationError.field(f"limits.{str(key)[:64]}",
                                        f"unknown field (known: {', '.join(LIMIT_FIELDS)})")
    budget = value.get("monthly_budget_usd")
    amount = None if budget is None else usd_text(parse_usd(budget, "limits.monthly_budget_usd"))
    on_budget = value.get("on_budget", "fail")
    if on_budget not in ON_BUDGET:
        raise ValidationError.field("limits.on_budget", "must be 'fail' or 'pause'")
    return {"monthly_budget_usd": amount, "on_budget": on_budget}


def parse_role(value: Any, field: str = "role") -> WorkspaceRole:
    try:
        return WorkspaceRole(value)
    except ValueError:
        raise ValidationError.field(field, f"must be one of {', '.join(WORKSPACE_ROLES)}") from None


def monthly_budget(workspace: Workspace):
    """The workspace's monthly cap as a Decimal (None: none)."""
    return read_usd((workspace.limits or {}).get("monthly_budget_usd"))


# --- workspaces ----------------------------------------------------------------------------


def audited_fields(workspace: Workspace) -> dict[str, Any]:
    """What an audit entry shows of a workspace's change (SPEC §16)."""
    return {"name": workspace.name, "limits": workspace.limits}


def _target(workspace: Workspace) -> dict[str, Any]:
    return audit.target("workspace", workspace.id, workspace.name)


def _member_target(user_id: str, user_name: str) -> dict[str, Any]:
    """A member entry targets the member (SPEC §16)."""
    return audit.target("member", user_id, user_name)



async def create_workspace(core: Shared, user: Caller, *, name: str, limits: Any = None) -> Workspace:
    """A team workspace whose only member, its owner, is the caller."""
    name = clean_name(name, "name", NAME_MAX)
    cleaned = clean_limits(limits)
    async with core.write_transaction():
        workspace = await Workspace.acreate(name=name, personal=False, limits=cleaned)
        await WorkspaceMember.acreate(workspace=workspace.id, user=user.user_id, role=WorkspaceRole.OWNER.value)
        await audit.record(core, action="workspace.create", target=_target(workspace),
                           changes=audit.diff({}, audited_fields(workspace)), workspace_id=workspace.id)
    return workspace


async def list_workspaces(core: Shared, user: Caller, *, every: bool = False) -> list[tuple[Workspace, WorkspaceRole]]:
    """The caller's workspaces (personal first, then oldest first) with the caller's role;
    `every`: all of the install's (SUPER_ADMINISTRATOR only, else 403)."""
    if every and Role(user.role) != Role.SUPER_ADMINISTRATOR:
        raise PermissionDeniedError("Only a SUPER_ADMINISTRATOR may list every workspace (all=true).")
    await personal_workspace(core, user.user_id)
    roles = await member_workspaces(core, user.user_id)
    query = Workspace.select()
    if not every:
        query = query.where(Workspace.id.in_(list(roles)))
    rows = await core.db.list(query.order_by(Workspace.created_at, Workspace.id))
    rows.sort(key=lambda w: (w.personal_user_id != user.user_id, not w.personal))
    return [(w, roles.get(w.id, WorkspaceRole.OWNER)) for w in rows]


async def get_workspace(core: Shared, user: Caller, workspace_id: str) -> Access:
    return await require(core, user, workspace_id, Action.READ)


async def update_workspace(core: Shared, user: Caller, workspace_id: str, *,
                           fields: dict[str, Any]) -> Access:
    """Change the fields sent (`name`, `limits`; null limits: none); admin and above."""
    found = await require(core, user, workspace_id, Action.MANAGE)
    workspace = found.workspace
    before = audited_fields(workspace)
    changed = []
    if "name" in fields and fields["name"] is not None:
        workspace.name = clean_name(fields["name"], "name", NAME_MAX)
        changed.append(Workspace.name)
    if "limits" in fields:
        workspace.limits = clean_limits(fields["limits"])
        changed.append(Workspace.limits)
    changes = audit.diff(before, audited_fields(workspace))
    if changed and changes:
        async with core.write_transaction():
            await workspace.asave(only=changed)
            await audit.record(core, action="workspace.update", target=_target(workspace),
                               changes=changes, workspace_id=workspace.id)
    return found


async def delete_workspace(core: Shared, user: Caller, workspace_id: str) -> Workspace:
    """Delete a team workspace and everything in it; owner only; 409 for a personal one
    or one that holds active runs or enabled schedules."""
    found = await require(core, user, workspace_id, Action.DELETE)
    workspace = found.workspace
    if workspace.personal:
        raise ConflictError("A personal workspace cannot be deleted (it lasts as long as its user).")
    async with core.write_transaction():
        active = await core.db.count(WorkflowRun.select(WorkflowRun.trace_id).where(
            (WorkflowRun.workspace_id == workspace.id) & WorkflowRun.status.in_(list(ACTIVE))))
        if active:
            raise ConflictError(f"The workspace holds {active} active run(s): cancel them or let "
                                "them end before deleting it.")
        enabled = await core.db.count(WorkflowSchedule.select(WorkflowSchedule.id).where(
            (WorkflowSchedule.workspace_id == workspace.id) & (WorkflowSchedule.enabled == True)))  # noqa: E712
        if enabled:
            raise ConflictError(f"The workspace has {enabled} enabled schedule(s): disable or "
                                "delete them before deleting it.")
        deleted = await core.db.aexecute(Workspace.delete().where(Workspace.id == workspace.id))
        if deleted:  # its chain stays (a SUPER_ADMINISTRATOR reads it)
            await audit.record(core, action="workspace.delete", target=_target(workspace),
                               changes=audit.diff(audited_fields(workspace), {}), workspace_id=workspace.id)
    return workspace


# --- members -------------------------------------------------------------------------------


def member_view(row: WorkspaceMember, user_name: str) -> dict[str, Any]:
    return {"user_id": row.user_id, "user_name": user_name, "role": row.role}


async def list_members(core: Shared, user: Caller, workspace_id: str) -> list[dict[str, Any]]:
    """Every member, owners first, then by name; viewer and above."""
    await require(core, user, workspace_id, Action.READ)
    rows = await core.db.list(WorkspaceMember.select().where(WorkspaceMember.workspace == workspace_id))
    names = {u.id: u.user_name for u in await core.db.list(
        User.select(User.id, User.user_name).where(User.id.in_([r.user_id for r in rows])))}
    members = [member_view(r, names.get(r.user_id, "")) for r in rows]
    members.sort(key=lambda m: (-WorkspaceRole(m["role"]).rank, m["user_name"].casefold()))
    return members


async def _named_user(core: Shared, *, user_id: str | None, user_name: str | None) -> User:
    if user_id is not None:
        return await auth.get_user(core, user_id)
    if user_name is not None:
        return await auth.find_user(core, user_name)
    raise ValidationError.field("user_name", "name the user to add: user_name or user_id")


def _may_grant(found: Access, role: WorkspaceRole) -> None:
    """Granting or taking `owner` needs an owner; everything else admin."""
    action = Action.MANAGE_OWNERS if role == WorkspaceRole.OWNER else Action.MANAGE
    if not allows(found.role, action):
        raise refusal(found.role, action, found.workspace.name)


async def add_member(core: Shared, user: Caller, workspace_id: str, *, role: Any,
                     user_id: str | None = None, user_name: str | None = None) -> dict[str, Any]:
    """Add a user with a role; admin and above (owner for `owner`). 404 UserNotExistError
    for no such user; 409 for a personal workspace or a user already a member."""
    found = await require(core, user, workspace_id, Action.MANAGE)
    chosen = parse_role(role)
    _may_grant(found, chosen)
    target = await _named_user(core, user_id=user_id, user_name=user_name)
    if found.workspace.personal:
        raise ConflictError("A personal workspace is never shared: create a team workspace "
                            "(POST /api/v1/workspace) and add members there.")
    try:
        async with core.write_transaction():
            row = await WorkspaceMember.acreate(workspace=found.workspace.id, user=target.id, role=chosen.value)
            await audit.record(core, action="member.add", target=_member_target(target.id, target.user_name),
                               changes={"role": audit.change(None, chosen.value)},
                               workspace_id=found.workspace.id)
    except IntegrityError:
        raise ConflictError(f"'{target.user_name}' is already a member of this workspace; "
                            "change their role with PUT …/member/{user_id}.") from None
    return member_view(row, target.user_name)


async def _member(workspace_id: str, user_id: str) -> WorkspaceMember:
    row = None
    if len(user_id) <= 36 and "\x00" not in user_id:
        row = await WorkspaceMember.aget_or_none((WorkspaceMember.workspace == workspace_id)
                                                 & (WorkspaceMember.user == user_id))
    if row is None:
        raise NotFoundError(f"The user '{user_id[:80]}' is not a member of this workspace.")
    return row


async def _owners(core: Shared, workspace_id: str) -> int:
    return await core.db.count(WorkspaceMember.select(WorkspaceMember.user).where(
        (WorkspaceMember.workspace == workspace_id) & (WorkspaceMember.role == WorkspaceRole.OWNER.value)))


async def update_member(core: Shared, user: Caller, workspace_id: str, member_id: str, *,
                        role: Any) -> dict[str, Any]:
    """Change a member's role; admin and above (owner to grant or take `owner`); the last
    owner cannot be demoted (409)."""
    found = await require(core, user, workspace_id, Action.MANAGE)
    chosen = parse_role(role)
    async with core.write_transaction():
        row = await _member(found.workspace.id, member_id)
        if WorkspaceRole.OWNER in (chosen, WorkspaceRole(row.role)):
            _may_grant(found, WorkspaceRole.OWNER)
        if row.role == WorkspaceRole.OWNER and chosen != WorkspaceRole.OWNER \
                and await _owners(core, found.workspace.id) <= 1:
            raise ConflictError("The last owner of a workspace cannot be demoted: make another "
                                "member owner first.")
        before, row.role = row.role, chosen.value
        target = await User.aget(User.id == row.user_id)
        if before != chosen.value:
            await core.db.aexecute(WorkspaceMember.update(role=chosen.value).where(
                (WorkspaceMember.workspace == found.workspace.id) & (WorkspaceMember.user == row.user_id)))
            await audit.record(core, action="member.update", target=_member_target(target.id, target.user_name),
                               changes={"role": audit.change(before, chosen.value)},
                               workspace_id=found.workspace.id)
    return member_view(row, target.user_name)


async def remove_member(core: Shared, user: Caller, workspace_id: str, member_id: str) -> dict[str, Any]:
    """Remove a member (admin and above; owner to remove an owner; any member may leave);
    the last owner cannot leave (409)."""
    found = await access(core, user, workspace_id)
    if member_id != user.user_id:
        found = await require(core, user, workspace_id, Action.MANAGE)
    async with core.write_transaction():
        row = await _member(found.workspace.id, member_id)
        if row.role == WorkspaceRole.OWNER:
            if member_id != user.user_id:
                _may_grant(found, WorkspaceRole.OWNER)
            if await _owners(core, found.workspace.id) <= 1:
                raise ConflictError("The last owner of a workspace cannot leave it: make another "
                                    "member owner first, or delete the workspace.")
        target = await User.aget(User.id == row.user_id)
        removed = await core.db.aexecute(WorkspaceMember.delete().where(
            (WorkspaceMember.workspace == found.workspace.id) & (WorkspaceMember.user == row.user_id)))
        if removed:
            await audit.record(core, action="member.remove", target=_member_target(target.id, target.user_name),
                               changes={"role": audit.change(row.role, None)},
                               workspace_id=found.workspace.id)
    return member_view(row, target.user_name)
