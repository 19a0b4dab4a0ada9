"""Workspaces and their members (SPEC §16): create, list, read, change, delete; add,
list, change and remove members. What each role may do is services/workspace_rights.py,
asked through `require` before every act.

Money (SPEC §16): a workspace's `limits.monthly_budget_usd` caps what all its runs
spend in a calendar month (UTC); the engine reserves each call under it
(engine/store/workspace_month.py). Changing the limits here: every process is told
(`caches.changed(TABLE)`; on PostgreSQL also the trigger's hint); a cap set where there
was none counts the month so far (its finished step instances' costs, as `GET /usage`
reads them) when the month has no running total yet; and a cap raised or removed
queues again, in the same transaction, the workspace's runs that its month paused
(`waiting_budget`, their last `budget_exhausted` naming the workspace), as a run's
top-up does for its run (services/spend.py).

Rules kept here: a personal workspace is never shared (a member add is 409) nor deleted
(409); a workspace is not deleted while it holds active runs or enabled schedules (409);
only an owner grants or removes `owner`; the last owner can neither leave nor be demoted
(409 `ConflictError`); any member may leave (remove themselves).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from peewee import IntegrityError

from orchestra.db.models import RunEvent, RunStep, User, WorkflowRun, iso
from orchestra.db.trigger_models import WorkflowSchedule
from orchestra.db.workspace_models import Workspace, WorkspaceMember, WorkspaceMonth
from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.money.amounts import parse_usd, read_usd, to_pico, usd_text
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
from orchestra.vocabulary import ACTIVE, EventKind, RunStatus

TABLE = "workspace"  # the caches built from it: the engine's copy of which have a monthly budget
NAME_MAX = 128
MONTH_SEED_ROWS_MAX = 200_000  # step instances a new cap's month so far reads at most
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


def _cap_pusd(limits: dict[str, Any] | None) -> int | None:
    """The cap as the engine compares with it: whole pico-dollars, rounded down."""
    amount = read_usd((limits or {}).get("monthly_budget_usd"))
    return None if amount is None else to_pico(amount, up=False)


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
        workspace = await Workspace.acreate(name=name, personal=False, limits=cleaned,
                                            monthly_budget_pusd=_cap_pusd(cleaned))
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
        workspace.monthly_budget_pusd = _cap_pusd(workspace.limits)
        changed += [Workspace.limits, Workspace.monthly_budget_pusd]
    changes = audit.diff(before, audited_fields(workspace))
    resumed: list[str] = []
    if changed and changes:
        old_cap, new_cap = read_usd((before["limits"] or {}).get("monthly_budget_usd")), monthly_budget(workspace)
        async with core.write_transaction():
            await workspace.asave(only=changed)
            if new_cap is not None and old_cap is None:
                await _seed_month(core, workspace.id)
            if old_cap is not None and (new_cap is None or new_cap > old_cap):
                resumed = await _requeue_paused(core, workspace.id)
            await audit.record(core, action="workspace.update", target=_target(workspace),
                               changes=changes, workspace_id=workspace.id)
        if "limits" in changes:
            core.caches.changed(TABLE)
        for trace_id in resumed:
            await core.engine.submit(trace_id)
    return found


def month_start(now: dt.datetime | None = None) -> tuple[str, dt.datetime]:
    """The current calendar month (UTC): its key "YYYY-MM" and its first moment (naive UTC)."""
    now = now or dt.datetime.now(dt.UTC)
    return f"{now.year:04d}-{now.month:02d}", dt.datetime(now.year, now.month, 1)


async def _seed_month(core: Shared, workspace_id: str) -> None:
    """A cap set where there was none: the month's running total, when it has none yet,
    starts from what the month's finished step instances of the workspace's runs cost."""
    month, start = month_start()
    rows = await core.db.list(
        RunStep.select(RunStep.cost_usd).join(WorkflowRun, on=(RunStep.run == WorkflowRun.trace_id))
        .where((WorkflowRun.workspace_id == workspace_id) & (RunStep.finished_at >= start)
               & RunStep.cost_usd.is_null(False))
        .limit(MONTH_SEED_ROWS_MAX).tuples())
    spent = sum((Decimal(cost) for (cost,) in rows), Decimal(0))
    await core.db.aexecute(WorkspaceMonth.insert(workspace=workspace_id, month=month, spent_pusd=to_pico(spent))
                           .on_conflict_ignore())


async def _requeue_paused(core: Shared, workspace_id: str) -> list[str]:
    """Queue again the workspace's runs its month paused (their last `budget_exhausted`
    names the workspace), inside the caller's transaction; their trace ids."""
    waiting = [trace_id for (trace_id,) in await core.db.list(
        WorkflowRun.select(WorkflowRun.trace_id).where(
            (WorkflowRun.workspace_id == workspace_id) & (WorkflowRun.status == RunStatus.WAITING_BUDGET)).tuples())]
    if not waiting:
        return []
    last: dict[str, Any] = {}
    for run_id, data in await core.db.list(
            RunEvent.select(RunEvent.run, RunEvent.data).where(
                RunEvent.run.in_(waiting) & (RunEvent.kind == EventKind.BUDGET_EXHAUSTED))
            .order_by(RunEvent.seq).tuples()):
        last[run_id] = data
    paused = [trace_id for trace_id in waiting if ((last.get(trace_id) or {}).get("workspace_id")) == workspace_id]
    if paused:
        await core.db.aexecute(
            WorkflowRun.update(status=RunStatus.QUEUED, owner_process=None, lease_until=None)
            .where(WorkflowRun.trace_id.in_(paused) & (WorkflowRun.status == RunStatus.WAITING_BUDGET)))
    return paused


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


def _may_grant(found: Access, *roles: WorkspaceRole) -> None:
    """Granting, taking or removing `owner` (among `roles`: the one granted, the member's
    now) needs an owner; everything else admin. The one check of a member change, so a
    refusal names the least role that has the right asked for (SPEC §16): an editor
    granting `owner` is told `owner`, not `admin`."""
    action = Action.MANAGE_OWNERS if WorkspaceRole.OWNER in roles else Action.MANAGE
    if not allows(found.role, action):
        raise refusal(found.role, action, found.workspace.name)


async def add_member(core: Shared, user: Caller, workspace_id: str, *, role: Any,
                     user_id: str | None = None, user_name: str | None = None) -> dict[str, Any]:
    """Add a user with a role; admin and above (owner for `owner`). 404 UserNotExistError
    for no such user; 409 for a personal workspace or a user already a member."""
    found = await access(core, user, workspace_id)
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
    found = await access(core, user, workspace_id)
    chosen = parse_role(role)
    async with core.write_transaction():
        row = await _member(found.workspace.id, member_id)
        _may_grant(found, chosen, WorkspaceRole(row.role))
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
    async with core.write_transaction():
        row = await _member(found.workspace.id, member_id)
        if member_id != user.user_id:
            _may_grant(found, WorkspaceRole(row.role))
        if row.role == WorkspaceRole.OWNER and await _owners(core, found.workspace.id) <= 1:
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
