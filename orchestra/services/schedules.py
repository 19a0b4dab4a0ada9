"""Schedules (SPEC §11): a five-field cron in an IANA time zone that starts runs of a
template as its owner. This module saves, reads and shows them; firing is
`schedule_fires` (the loop every server process runs).

A schedule belongs to a workspace (SPEC §16: default its creator's personal one) and
names a template of that workspace (or a shared one); in a team workspace its members
read it and its editors change it (services/workspace_scope.py), and it fires as its
owner while the owner may still run the template.

A schedule's `next_due_at` is the next due time no process has handled yet. Saving
one (create, or a change of cron, zone or enabled) sets it to the first due time after
now: due times that passed before the save are never fired. Every save is announced to
every process (`announce_change`: a `cache` hint for the table, as the triggers send for
other tables), so an idle process's fire loop reads the next due time again at once.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from orchestra.db.models import WorkflowRun, WorkflowTemplate, iso, utcnow
from orchestra.db.trigger_models import ScheduleFire, WorkflowSchedule
from orchestra.errors import NotFoundError, ValidationError
from orchestra.services import audit, caps, cron, workspace_scope
from orchestra.services.paging import Page, decode_cursor, encode_cursor, keyset_page
from orchestra.services.run_access import require_runnable
from orchestra.services.shared import Shared
from orchestra.services.trigger_runs import checked_input
from orchestra.services.workspace_rights import Action

logger = logging.getLogger("orchestra.schedules")

TABLE = WorkflowSchedule._meta.table_name  # the `cache` hint a save sends
OVERLAPS = ("skip", "allow", "cancel_previous")
CATCHUPS = ("none", "latest", "all")
WINDOW_DEFAULT = 3600
WINDOW_MAX = 7 * 24 * 3600


def _known_id(value: str) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 36 and "\x00" not in value


async def get_schedule(core: Shared, *, user_id: str, schedule_id: str,
                       action: Action = Action.READ) -> WorkflowSchedule:
    """A schedule the caller may read (or, `action` edit, change): their own, or one of a
    team workspace by their role there; else 404 (403 for a member below the role)."""
    row = None
    if _known_id(schedule_id):
        row = await WorkflowSchedule.aget_or_none(WorkflowSchedule.id == schedule_id)
    missing = NotFoundError(f"No schedule has the id '{schedule_id}'.")
    if row is None:
        raise missing
    await workspace_scope.check_owned(core, user_id, row.owner_id, row.workspace_id, action, missing)
    return row


async def _fields(core: Shared, user_id: str, body: dict[str, Any],
                  workspace_id: str | None) -> dict[str, Any]:
    """Checked, normalized columns from a body (every field; the web layer fills defaults)."""
    problems: list[dict[str, str]] = []
    try:
        tz = cron.zone(body["timezone"])
    except cron.CronProblem as exc:
        problems.append({"field": "timezone", "problem": str(exc)})
        tz = None
    expression = body["cron"]
    if tz is not None:
        try:
            expression = cron.check(body["cron"], tz, seconds=core.settings.cron_seconds)
        except cron.CronProblem as exc:
            problems.append({"field": "cron", "problem": str(exc)})
    if body["overlap"] not in OVERLAPS:
        problems.append({"field": "overlap", "problem": f"must be one of {', '.join(OVERLAPS)}"})
    if body["catchup"] not in CATCHUPS:
        problems.append({"field": "catchup", "problem": f"must be one of {', '.join(CATCHUPS)}"})
    window = body["catchup_window_seconds"]
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= WINDOW_MAX:
        problems.append({"field": "catchup_window_seconds", "problem": f"must be an integer from 0 to {WINDOW_MAX}"})
    try:
        (template,) = await require_runnable(core, user_id=user_id, template_ids=[body["template_id"]],
                                             field="template_id", workspace_id=workspace_id)
    except ValidationError as exc:
        problems += exc.detail
        template = None
    if template is not None:
        try:
            await checked_input(core, template, body["input"])
        except ValidationError as exc:
            problems += exc.detail
    if problems:
        summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems[:5])
        raise ValidationError(f"Invalid schedule: {summary}.", detail=problems)
    return {
        "template": template.id, "cron": expression, "timezone": body["timezone"],
        "input": body["input"], "overlap": body["overlap"], "catchup": body["catchup"],
        "catchup_window_seconds": window, "enabled": bool(body["enabled"]),
    }


AUDITED = ("template_id", "cron", "timezone", "input", "overlap", "catchup", "catchup_window_seconds",
           "enabled")


def audited_fields(row: WorkflowSchedule | dict[str, Any]) -> dict[str, Any]:
    """What an audit entry shows of a schedule's change (SPEC §16): enabling or pausing
    one is an update of `enabled`."""
    if isinstance(row, dict):
        return {name: row["template" if name == "template_id" else name] for name in AUDITED}
    return {name: getattr(row, name) for name in AUDITED}


async def _target(core: Shared, schedule_id: str, template_id: str) -> dict[str, Any]:
    """A schedule's entry names it by its template's name (a schedule has none)."""
    rows = await core.db.list(WorkflowTemplate.select(WorkflowTemplate.name)
                              .where(WorkflowTemplate.id == template_id))
    return audit.target("schedule", schedule_id, rows[0].name if rows else None)


def _next_due(fields: dict[str, Any], now: dt.datetime) -> dt.datetime | None:
    if not fields["enabled"]:
        return None
    tz = cron.zone(fields["timezone"])
    due = cron.first_after(fields["cron"], tz, now.replace(tzinfo=cron.UTC))
    return None if due is None else cron.to_naive_utc(due)


async def create_schedule(core: Shared, *, user_id: str, body: dict[str, Any]) -> WorkflowSchedule:
    """Store a schedule in `body["workspace_id"]` (an editor's there; default the caller's
    personal workspace) on a template of that workspace."""
    workspace_id = await workspace_scope.target(core, user_id, body.get("workspace_id"), Action.EDIT)
    fields = await _fields(core, user_id, body, workspace_id)
    fields["workspace_id"] = workspace_id
    now = utcnow()
    async with core.write_transaction():
        await caps.check(core, WorkflowSchedule.select().where(WorkflowSchedule.owner == user_id),
                         setting="max_schedules_per_user", what="schedules", field="template_id")
        row = await WorkflowSchedule.acreate(owner=user_id, next_due_at=_next_due(fields, now),
                                             created_at=now, updated_at=now, **fields)
        await audit.record(core, action="schedule.create", target=await _target(core, row.id, fields["template"]),
                           changes=audit.diff({}, audited_fields(fields)), workspace_id=workspace_id)
    await announce_change(core)
    return row


async def update_schedule(core: Shared, *, user_id: str, schedule_id: str, body: dict[str, Any]) -> WorkflowSchedule:
    """Replace every field. A changed cron, zone or `enabled` starts counting from now."""
    row = await get_schedule(core, user_id=user_id, schedule_id=schedule_id, action=Action.EDIT)
    fields = await _fields(core, user_id, body, row.workspace_id)
    now = utcnow()
    timing = (row.cron, row.timezone, row.enabled) != (fields["cron"], fields["timezone"], fields["enabled"])
    values = dict(fields, updated_at=now)
    if timing:
        values["next_due_at"] = _next_due(fields, now)
    async with core.write_transaction():
        if not await core.db.aexecute(WorkflowSchedule.update(**values).where(WorkflowSchedule.id == row.id)):
            raise NotFoundError(f"No schedule has the id '{schedule_id}'.")  # deleted meanwhile
        await audit.record(core, action="schedule.update", target=await _target(core, row.id, fields["template"]),
                           changes=audit.diff(audited_fields(row), audited_fields(fields)),
                           workspace_id=audit.workspace_of(row))
    await announce_change(core)
    return await WorkflowSchedule.aget(WorkflowSchedule.id == row.id)


async def delete_schedule(core: Shared, *, user_id: str, schedule_id: str) -> None:
    row = await get_schedule(core, user_id=user_id, schedule_id=schedule_id, action=Action.EDIT)
    async with core.write_transaction():
        if await core.db.aexecute(WorkflowSchedule.delete().where(WorkflowSchedule.id == row.id)):
            await audit.record(core, action="schedule.delete", target=await _target(core, row.id, row.template_id),
                               changes=audit.diff(audited_fields(row), {}), workspace_id=audit.workspace_of(row))
    await announce_change(core)


async def list_schedules(core: Shared, *, user_id: str, limit: int, cursor: str | None,
                         workspace_id: str | None = None) -> Page[WorkflowSchedule]:
    """The caller's schedules and their team workspaces' (`workspace_id`: that one's only)."""
    where = await workspace_scope.owned_where(core, user_id, workspace_id, WorkflowSchedule.owner,
                                              WorkflowSchedule.workspace_id)
    query = WorkflowSchedule.select().where(where)
    return await keyset_page(core.db, query, kind="schedule", at=WorkflowSchedule.created_at,
                             key=WorkflowSchedule.id, limit=limit, cursor=cursor)


async def last_fires(core: Shared, schedule_ids: list[str]) -> dict[str, ScheduleFire]:
    """Each schedule's latest handled due time (one query per schedule, on the unique index)."""
    found: dict[str, ScheduleFire] = {}
    for schedule_id in schedule_ids:
        rows = await core.db.list(
            ScheduleFire.select().where(ScheduleFire.schedule == schedule_id)
            .order_by(ScheduleFire.due_at.desc()).limit(1))
        if rows:
            found[schedule_id] = rows[0]
    return found


async def list_fires(core: Shared, *, user_id: str, schedule_id: str, limit: int,
                     cursor: str | None) -> tuple[WorkflowSchedule, Page[ScheduleFire], dict[str, str]]:
    """A page of the caller's schedule's fires, newest due time first, and the status of
    each started run still stored ({trace_id: status}). A due time is handled once per
    schedule (the unique index on (schedule, due_at)), so the due time alone is the page's
    position; the cursor carries the fire's id only to keep the published cursor form."""
    row = await get_schedule(core, user_id=user_id, schedule_id=schedule_id)
    query = ScheduleFire.select().where(ScheduleFire.schedule == row.id)
    if cursor is not None:
        position, _ = decode_cursor("fire", cursor)
        query = query.where(ScheduleFire.due_at < position)
    rows = await core.db.list(query.order_by(ScheduleFire.due_at.desc()).limit(limit + 1))
    page = Page(rows, None)
    if len(rows) > limit:
        rows = rows[:limit]
        page = Page(rows, encode_cursor("fire", rows[-1].due_at, str(rows[-1].id)))
    traces = [f.trace_id for f in rows if f.trace_id]
    statuses = {}
    if traces:
        statuses = dict(await core.db.list(
            WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.status)
            .where(WorkflowRun.trace_id.in_(traces)).tuples()))
    return row, page, statuses


def fire_view(fire: ScheduleFire, tz: Any, run_status: str | None) -> dict[str, Any]:
    """One handled due time as the API shows it (times in the schedule's zone)."""
    return {
        "due_at": cron.iso_in(fire.due_at, tz),
        "fired_at": cron.iso_in(fire.fired_at, tz),
        "outcome": fire.outcome,
        "trace_id": fire.trace_id,
        "run_status": run_status,
        "error": fire.error,
    }


def zone_of(row: WorkflowSchedule) -> Any:
    """The schedule's zone (UTC for one this server's zone database no longer knows)."""
    try:
        return cron.zone(row.timezone)
    except cron.CronProblem:  # stored before this server's zone database lost it
        return cron.zone("UTC")


def schedule_view(row: WorkflowSchedule, last: ScheduleFire | None, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """A schedule as the API shows it: `next_fires` and `last_fire` in its own zone."""
    tz = zone_of(row)
    upcoming: list[str] = []
    if row.enabled:
        start = row.next_due_at or now or utcnow()
        # The next due time not yet handled, then the ones after it.
        first = cron.from_naive_utc(start, tz) - dt.timedelta(seconds=1)
        upcoming = [d.isoformat() for d in cron.next_fires(row.cron, tz, first)]
    return {
        "schedule_id": row.id,
        "template_id": row.template_id,
        "owner_id": row.owner_id,
        "workspace_id": row.workspace_id,
        "cron": row.cron,
        "timezone": row.timezone,
        "input": row.input,
        "overlap": row.overlap,
        "catchup": row.catchup,
        "catchup_window_seconds": row.catchup_window_seconds,
        "enabled": row.enabled,
        "next_fires": upcoming,
        "last_fire": None if last is None else {
            "due_at": cron.iso_in(last.due_at, tz),
            "trace_id": last.trace_id,
            "outcome": last.outcome,
            **({"error": last.error} if last.error else {}),
        },
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
    }


async def announce_change(core: Shared) -> None:
    """A schedule was saved, changed, paused or deleted: this process's fire loop, and
    every other process's (the `cache` hint, which `Core` wires to `wake_fire_loop`),
    read the next due time again now. A hint is only a hint: a process that misses it
    (its LISTEN connection was down) looks again within the fire loop's idle sleep."""
    wake_fire_loop(core)
    try:
        await core.signals.notify("cache", TABLE)
    except Exception as exc:  # noqa: BLE001 - the save stands; others see it at their next look
        logger.warning("could not tell the other processes of a schedule change (%s)", exc)


def wake_fire_loop(core: Shared) -> None:
    """A schedule changed: this process's fire loop reads the next due time again."""
    core.fire_wake.set()
