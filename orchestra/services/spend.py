"""Spend of runs (SPEC §12): a run's budget shown, its top-up, and usage reports.

A run's budget is the smaller of its template's `limits.budget_usd` and the
`budget_usd` it was started with; it is kept in whole pico-dollars (rounded down), set
when the run is created (engine/store/creation.py: the budget rules of every start). A
top-up raises the budget of a run `waiting_budget` and queues it again, in one
conditional statement, from any process; the next process with room claims it and goes
on from where it stopped (its finished steps are never called again).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal
from typing import Any

from orchestra.db.models import Provider, RunEvent, RunStep, User, WorkflowRun, WorkflowTemplate
from orchestra.db.workspace_models import Workspace
from orchestra.errors import ConflictError, ValidationError
from orchestra.money.amounts import from_pico, parse_usd, to_pico, usd_text
from orchestra.services import audit, workspace_scope
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action
from orchestra.vocabulary import EventKind, RunStatus

GROUPS = ("user", "template", "provider", "model", "day", "workspace")
USAGE_ROWS_MAX = 200_000  # step instances one report reads at most (a bounded query)


def money_fields(run: WorkflowRun) -> dict[str, Any]:
    """A run's `cost_usd` (everything its calls cost, reservations of calls lost in a
    crash included; null when no call was priced) and `budget_usd` (null: none)."""
    return {"cost_usd": usd_text(from_pico(run.spent_pusd)),
            "budget_usd": usd_text(from_pico(run.budget_pusd))}


async def top_up(core: Shared, run: WorkflowRun, add_usd: Any) -> tuple[WorkflowRun, WorkflowRun]:
    """Raise the budget that stopped a run and queue again every run it stopped; 409 when
    nothing waits for it. The budget is the run's own, or — a child run stopped by a
    budget above it (SPEC §14) — that run's; a run whose descendants wait for its budget
    may be topped up too. (the run, the run whose budget was raised)."""
    amount = parse_usd(add_usd, "add_usd", allow_zero=False)
    owner = await _budget_run(core, run)
    tree = await _tree(core, owner.trace_id)
    async with core.db.atomic():
        waiting = [row.trace_id for row in await core.db.list(
            WorkflowRun.select(WorkflowRun.trace_id).where(
                WorkflowRun.trace_id.in_(tree) & (WorkflowRun.status == RunStatus.WAITING_BUDGET)))]
        if run.status != RunStatus.WAITING_BUDGET and not waiting:
            raise ConflictError(f"The run is not waiting for budget ({run.status}).")
        requeued = await core.db.aexecute(
            WorkflowRun.update(status=RunStatus.QUEUED, owner_process=None, lease_until=None)
            .where(WorkflowRun.trace_id.in_(waiting) & (WorkflowRun.status == RunStatus.WAITING_BUDGET)))
        raised = await core.db.aexecute(
            WorkflowRun.update(budget_pusd=WorkflowRun.budget_pusd + to_pico(amount, up=False))
            .where((WorkflowRun.trace_id == owner.trace_id) & WorkflowRun.budget_pusd.is_null(False)))
        if not requeued or not raised:
            raise ConflictError(f"The run is not waiting for budget ({run.status}).")
        raised_to = (await WorkflowRun.aget(WorkflowRun.trace_id == owner.trace_id)).budget_pusd
        before, after = from_pico(raised_to - to_pico(amount, up=False)), from_pico(raised_to)
        await audit.record(core, action="run.top_up", target=audit.target("run", owner.trace_id, owner.template_name),
                           changes={"budget_usd": audit.change(usd_text(before), usd_text(after)),
                                    "requeued": audit.change(None, waiting)},
                           workspace_id=audit.workspace_of(owner))
    for trace_id in waiting:
        await core.engine.submit(trace_id)
    return (await WorkflowRun.aget(WorkflowRun.trace_id == run.trace_id),
            await WorkflowRun.aget(WorkflowRun.trace_id == owner.trace_id))


async def _budget_run(core: Shared, run: WorkflowRun) -> WorkflowRun:
    """The run whose budget stopped `run` (its last `budget_exhausted` names it), else itself."""
    if run.status != RunStatus.WAITING_BUDGET:
        return run
    last = await core.db.list(RunEvent.select(RunEvent.data).where(
        (RunEvent.run == run.trace_id) & (RunEvent.kind == EventKind.BUDGET_EXHAUSTED))
        .order_by(RunEvent.seq.desc()).limit(1))
    paused_by = (last[0].data or {}) if last else {}
    if paused_by.get("workspace_id"):  # its workspace's month (SPEC §16): a top-up does not help
        raise ConflictError(
            f"The run waits for its workspace's monthly budget ({paused_by.get('month')}): raise "
            f"limits.monthly_budget_usd (PUT /api/v1/workspace/{paused_by['workspace_id']}) and it goes on.")
    whose = paused_by.get("budget_trace_id")
    if not whose or whose == run.trace_id:
        return run
    return await WorkflowRun.aget_or_none(WorkflowRun.trace_id == whose) or run


async def _tree(core: Shared, trace_id: str) -> list[str]:
    """A run and every run below it (SPEC §14: at most five levels)."""
    found, level = [trace_id], [trace_id]
    while level:
        rows = await core.db.list(WorkflowRun.select(WorkflowRun.trace_id)
                                  .where(WorkflowRun.parent_trace_id.in_(level)))
        level = [row.trace_id for row in rows]
        found += level
    return found


def _bound(value: str | None, field: str, *, end: bool) -> dt.datetime | None:
    """A `from`/`to` query value: a date (a whole UTC day; `to` includes it) or a
    date-time; 422 naming the field otherwise."""
    if value is None:
        return None
    text = value.strip()
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            start = dt.datetime(day.year, day.month, day.day)
            return start + dt.timedelta(days=1) if end else start
        if len(text) <= 40:
            moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            if moment.tzinfo is not None:  # naive: UTC already
                moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
            return moment
    except (ValueError, TypeError, OverflowError):
        pass
    raise ValidationError.field(field, "must be a date (2026-11-26) or a date-time (UTC)")


async def usage(core: Shared, *, user_id: str, is_admin: bool, group_by: str,
                start: str | None, end: str | None, workspace_id: str | None = None) -> list[dict[str, Any]]:
    """`[{key, runs, calls, input_tokens, output_tokens, cost_usd}]` of the step instances
    that called a model, grouped; the caller's own runs and those of the team workspaces
    they are a member of (SPEC §16: a viewer reads usage), every run for an administrator
    but those of team workspaces it is not a member of; with `workspace_id`, that
    workspace's runs alone (404 unless the caller is a member; a key's request: its key's
    workspace only). A step counts on the day it finished (else started)."""
    if group_by not in GROUPS:
        raise ValidationError.field("group_by", f"must be one of {', '.join(GROUPS)}")
    lower, upper = _bound(start, "from", end=False), _bound(end, "to", end=True)
    query = (RunStep.select(RunStep.run, RunStep.usage, RunStep.cost_usd, RunStep.provider_id,
                            RunStep.model, RunStep.calls, RunStep.finished_at, RunStep.started_at,
                            WorkflowRun.owner, WorkflowRun.template, WorkflowRun.template_name,
                            WorkflowRun.workspace_id)
             .join(WorkflowRun, on=(RunStep.run == WorkflowRun.trace_id))
             .where(RunStep.calls > 0))
    if workspace_scope.within_key(workspace_id) is not None:
        named = await workspace_scope.target(core, user_id, workspace_id, Action.READ)
        query = query.where(WorkflowRun.workspace_id == named)
    elif is_admin:
        hidden = await workspace_scope.hidden_teams(core, user_id)
        if hidden:
            query = query.where(WorkflowRun.workspace_id.is_null() | WorkflowRun.workspace_id.not_in(hidden))
    else:
        _, teams = await workspace_scope.listed(core, user_id, None)
        mine = WorkflowRun.owner == user_id
        query = query.where(mine | WorkflowRun.workspace_id.in_(teams) if teams else mine)
    when = RunStep.finished_at
    if lower is not None:
        query = query.where(when >= lower)
    if upper is not None:
        query = query.where(when < upper)
    rows = await core.db.list(query.limit(USAGE_ROWS_MAX).dicts())
    groups: dict[Any, dict[str, Any]] = defaultdict(lambda: {
        "runs": set(), "calls": 0, "input_tokens": 0, "output_tokens": 0, "cost": None})
    for row in rows:
        moment = row["finished_at"] or row["started_at"]
        key = {"user": row["owner"], "template": row["template"], "provider": row["provider_id"],
               "model": row["model"], "workspace": row["workspace_id"],
               "day": moment.date().isoformat() if moment is not None else None}[group_by]
        group = groups[key]
        group["runs"].add(row["run"])
        group["calls"] += row["calls"] or 0
        counts = row["usage"] or {}
        group["input_tokens"] += int(counts.get("prompt_tokens") or 0)
        group["output_tokens"] += int(counts.get("completion_tokens") or 0)
        if row["cost_usd"] is not None:
            group["cost"] = (group["cost"] or Decimal(0)) + Decimal(row["cost_usd"])
    names = await _names(core, group_by, [key for key in groups if key is not None], rows)
    named = group_by in ("template", "user", "provider", "workspace")  # a model or a day is its own name
    return [{"key": key, **({"name": names.get(key)} if named else {}), "runs": len(g["runs"]), "calls": g["calls"],
             "input_tokens": g["input_tokens"], "output_tokens": g["output_tokens"],
             "cost_usd": usd_text(g["cost"])}
            for key, g in sorted(groups.items(), key=lambda kv: (kv[0] is None, str(kv[0])))]


async def _names(core: Shared, group_by: str, keys: list[Any], rows: list[dict[str, Any]]) -> dict[Any, str]:
    """What a usage group's key is called: a template's, user's, provider's or workspace's
    current name (a deleted template: the name its runs recorded); none for a model or a day."""
    if not keys or group_by in ("model", "day"):
        return {}
    if group_by == "template":
        recorded = {row["template"]: row["template_name"] for row in rows if row["template_name"]}
        found = await core.db.list(WorkflowTemplate.select(WorkflowTemplate.id, WorkflowTemplate.name)
                                   .where(WorkflowTemplate.id.in_(keys)))
        return {**recorded, **{t.id: t.name for t in found}}
    if group_by == "user":
        users = await core.db.list(User.select(User.id, User.user_name).where(User.id.in_(keys)))
        return {u.id: u.user_name for u in users}
    if group_by == "workspace":
        spaces = await core.db.list(Workspace.select(Workspace.id, Workspace.name).where(Workspace.id.in_(keys)))
        return {w.id: w.name for w in spaces}
    providers = await core.db.list(Provider.select(Provider.id, Provider.name).where(Provider.id.in_(keys)))
    return {p.id: p.name for p in providers}


