"""Workflow runs (SPEC §4): start, read, cancel, reply, retry, and their stored events.

Runs belong to their starter; an administrator may read, cancel and answer any run.
Who may read a template, and so run it, is services/templates.py. Execution itself is
the engine (`orchestra.engine`, reached as `core.engine`).
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import (
    RunStep,
    Upload,
    WorkflowRun,
    WorkflowTemplate,
    iso,
)
from orchestra.engine import instances, reads
from orchestra.engine.run_task import step_output
from orchestra.engine.sizes import check_reply_size
from orchestra.engine.store.creation import NewRun, carried_budget, start_budget
from orchestra.engine.store.events import Event
from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.language import schemas, shape
from orchestra.services import audit, run_starts, spend, version_store, workspace_scope
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page
from orchestra.services.run_starts import StartKey
from orchestra.services.shared import Shared
from orchestra.services.templates import add_problem, get_template, named_agent, worker_names
from orchestra.services.workspace_rights import Action
from orchestra.vocabulary import FINISHED, EventKind, RunStatus, StepStatus

EVENTS_MAX = 1000  # events in one page of GET /run/{id}/events


# --- runs --------------------------------------------------------------------------------


async def start_run(
    core: Shared,
    *,
    user_id: str,
    is_admin: bool,
    template_id: str,
    input: Any = "",
    files: list[str] | None = None,
    trace_parent: str | None = None,
    budget_usd: Any = None,
    trigger: dict[str, Any] | None = None,
    remember: StartKey | None = None,
    template: WorkflowTemplate | None = None,
    version: int | None = None,
) -> WorkflowRun:
    """Store a `queued` run of a readable template and hand it to the engine. With an
    `input_schema` the input may be any JSON value and must validate; without one it is
    text. `trace_parent` (a W3C traceparent) is the trace the run's spans join;
    `trigger` says what started it (SPEC §11); `remember` is stored in the run's
    transaction, so a duplicate start fails with IntegrityError (services/run_starts.py).
    `template`, when the caller has already read it (and checked the user may run it).
    `version`: the template version to run (SPEC §13; default the latest, 404 unknown)."""
    if template is None:
        template = await get_template(core, user_id=user_id, is_admin=is_admin,
                                      template_id=template_id, action=Action.RUN)
    pinned = await version_store.for_run(core, template, version)
    spec = pinned.spec or {}
    budget = start_budget(spec, budget_usd)
    problems: list[dict[str, str]] = []
    if "input_schema" in spec:
        problems += await schemas.check(input, spec["input_schema"], root="input",
                                        sandbox=core.engine.request_sandbox)
        input_value, input_text = input, ""
    elif not isinstance(input, str):
        raise ValidationError.field("input", "must be a string (this template has no input_schema)")
    else:
        input_value, input_text = None, input
    if problems:
        raise ValidationError(
            f"The input does not match the template's input_schema: {schemas.describe(problems)}.",
            detail=problems,
        )
    attached = []
    for i, file_id in enumerate(dict.fromkeys(files or [])):
        upload = await Upload.aget_or_none((Upload.id == file_id) & (Upload.owner == user_id))
        if upload is None:
            add_problem(problems, f"files.{i}", f"unknown file '{file_id}' (not one of your uploads)")
        else:
            attached.append({"file_id": upload.id, "filename": upload.filename})
    if problems:
        raise ValidationError(f"Invalid files: {problems[0]['problem']}.", detail=problems)
    new = NewRun(owner_id=user_id, template_id=template.id, template_name=pinned.name,
                 template_version=pinned.version, steps=pinned.steps, spec=pinned.spec,
                 input_text=input_text, input_value=input_value, files=attached,
                 trace_parent=trace_parent, budget_pusd=budget, trigger=trigger,
                 workspace_id=template.workspace_id)  # a run belongs to its template's workspace
    async with core.db.atomic():  # with room here, stored claimed: it starts at once
        [run] = await core.engine.store.create([new], claim=core.engine.claim_now)
        if remember is not None:
            await run_starts.remember(core, remember, run.trace_id)
        await audit.record(core, action="run.start", target=run_target(run),
                           changes=run_changes(run), workspace_id=audit.workspace_of(run))
    await core.engine.begin(run)
    return run


def run_target(run: WorkflowRun) -> dict[str, Any]:
    return audit.target("run", run.trace_id, run.template_name)


def run_changes(run: WorkflowRun, **more: Any) -> dict[str, Any]:
    """A new run's entry: its status, template and version (and what `more` adds)."""
    return audit.diff({}, {"status": run.status, "template_id": run.template_id,
                           "template_version": run.template_version, "trigger": run.trigger, **more})


async def list_runs(
    core: Shared, *, user_id: str, is_admin: bool, all_users: bool = False,
    limit: int = DEFAULT_LIMIT, cursor: str | None = None, workspace_id: str | None = None,
) -> Page[WorkflowRun]:
    """A page of the caller's runs and those of the caller's team workspaces, newest first
    (`all_users`: everyone's, administrators only, but a team workspace's only for its
    members); `workspace_id`: that workspace's only (404 for a non-member)."""
    if all_users and not is_admin:
        raise PermissionDeniedError("Only an ADMINISTRATOR or above may list every user's runs.")
    query = WorkflowRun.select()
    workspace_id = workspace_scope.within_key(workspace_id)  # a key's request: its workspace's
    personal, teams = await workspace_scope.listed(core, user_id, workspace_id)
    if all_users:
        hidden = await workspace_scope.hidden_teams(core, user_id)
        if hidden:
            query = query.where(WorkflowRun.workspace_id.is_null() | WorkflowRun.workspace_id.not_in(hidden))
        if workspace_id is not None:
            query = query.where(WorkflowRun.workspace_id == workspace_id)
    elif workspace_id is None:
        where = WorkflowRun.owner == user_id
        query = query.where(where | WorkflowRun.workspace_id.in_(teams) if teams else where)
    elif personal:
        query = query.where((WorkflowRun.owner == user_id) & (
            (WorkflowRun.workspace_id == workspace_id) | WorkflowRun.workspace_id.is_null()))
    else:
        query = query.where(WorkflowRun.workspace_id == teams[0])
    return await keyset_page(
        core.db, query, kind="run", at=WorkflowRun.created_at, key=WorkflowRun.trace_id,
        limit=limit, cursor=cursor, newest_first=True,
    )


async def get_run(core: Shared, *, user_id: str, is_admin: bool, trace_id: str,
                  action: Action = Action.READ) -> WorkflowRun:
    """A run the caller may see: their own, or any run for an administrator; in a team
    workspace, the members' by role (`action`: read, or run: cancel, reply, retry, fork,
    top up), never a non-member's (an administrator's included)."""
    run = await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id)
    missing = NotFoundError(f"No run has the trace_id '{trace_id}'.")
    if run is None:
        raise missing
    team = await workspace_scope.resource_team(core, run.workspace_id, run.owner_id, missing)
    if team is not None:
        await workspace_scope.require_in(core, user_id, team, action, missing)
    elif run.owner_id != user_id and not is_admin:
        raise missing
    return run


def run_summary(run: WorkflowRun) -> dict[str, Any]:
    return {
        "trace_id": run.trace_id,
        "template_id": run.template_id,
        "template_name": run.template_name,
        "owner_id": run.owner_id,
        "workspace_id": run.workspace_id,
        "status": run.status,
        "error": run.error,
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "retry_of": run.retry_of,
        **spend.money_fields(run),
        # a child run (SPEC §14): the run and step instance that started it
        "parent": {"trace_id": run.parent_trace_id, "path": run.parent_path} if run.parent_trace_id else None,
        "trigger": run.trigger,
        "template_version": run.template_version,
        "forked_from": ({"trace_id": run.forked_from.get("trace_id"), "from_step": run.forked_from.get("from_step")}
                        if run.forked_from else None),
    }


def run_input(run: WorkflowRun) -> Any:
    """The run's input: a JSON value under an input_schema, else the text."""
    return run.input_value if "input_schema" in (run.spec or {}) else run.input


async def run_detail(core: Shared, run: WorkflowRun) -> dict[str, Any]:
    """The run with each step instance's status, output, error, usage and times (top-level
    steps in template order, each followed by its items, iterations and their inner
    steps, SPEC §8), and open questions."""
    rows = {r.path or r.step_id: r
            for r in await core.db.list(RunStep.select().where(RunStep.run == run.trace_id))}
    defs = {step["id"]: (n, step) for n, (step, _, _) in enumerate(shape.walk(run.steps))}

    def order(path: str) -> tuple:
        try:
            segments = instances.parse(path)
        except ValueError:
            return ((len(defs), path),)
        return tuple((defs.get(seg.step_id, (len(defs),))[0],
                      -1 if seg.item is None and seg.iteration is None else (seg.item or seg.iteration or 0))
                     for seg in segments)

    paths = [step["id"] for step in run.steps]
    paths += sorted((p for p in rows if p not in defs), key=order)
    paths.sort(key=order)
    names = await worker_names(core, run.steps)  # agent.worker reads back as a name (SPEC §7)
    steps = []
    for path in paths:
        row = rows.get(path)
        step_id = row.step_id if row else path
        step = defs.get(step_id, (0, {}))[1]
        steps.append({
            "step_id": step_id,
            "path": path,
            "agent": named_agent(step.get("agent"), names),
            "depends_on": step.get("depends_on", []),
            "status": row.status if row else StepStatus.PENDING,
            "attempt": row.attempt if row else 1,
            "reused": bool(row.reused) if row else False,
            "output": step_output(row) if row else None,
            "error": row.error if row else None,
            "usage": row.usage if row else None,
            "cost_usd": row.cost_usd if row else None,
            "child_trace_id": row.child_trace_id if row else None,
            "started_at": iso(row.started_at) if row else None,
            "finished_at": iso(row.finished_at) if row else None,
        })
    last = await reads.last_event(core.db, run.trace_id)
    return {
        **run_summary(run),
        "input": run_input(run),
        # the template's output, as run_finished gave it (null until the run succeeds)
        "output": last.data.get("output") if last is not None and last.kind == EventKind.RUN_FINISHED else None,
        "files": run.files or [],
        "steps": steps,
        "pending_replies": await pending_replies(core, run),
        "last_seq": last.seq if last is not None else 0,
    }


async def pending_replies(core: Shared, run: WorkflowRun) -> list[dict[str, str]]:
    """`[{request_id, step_id, prompt}]` the run waits on, oldest first."""
    if run.status in FINISHED:
        return []
    return await reads.open_questions(core.db, run.trace_id)


async def cancel_run(core: Shared, *, user_id: str, is_admin: bool, trace_id: str) -> WorkflowRun:
    """Cancel an unfinished run wherever it executes; 409 when it has already ended."""
    run = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id, action=Action.RUN)
    if run.status in FINISHED:
        raise ConflictError(f"The run has already ended ({run.status}).")

    async def entry() -> None:
        await audit.record(core, action="run.cancel", target=run_target(run),
                           changes={"cancel_requested": audit.change(False, True)},
                           workspace_id=audit.workspace_of(run))

    # its child runs (SPEC §14) with it: the whole tree marked in one statement
    await core.engine.cancel(trace_id, reason="The run was cancelled by request.", audit=entry)
    return await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)


async def reply(
    core: Shared, *, user_id: str, is_admin: bool, trace_id: str, content: Any, request_id: str | None = None
) -> dict[str, str]:
    """Answer the question a waiting run asked; 409 when it waits for none (or not this one),
    422 when the answer does not fit the step's output_schema, 413 when it is larger than
    a step's output may be (the question stays open)."""
    run = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id, action=Action.RUN)
    check_reply_size(content, limit=core.settings.step_output_max_bytes)

    async def entry(question) -> None:  # in the transaction that stores the answer
        await audit.record(core, action="run.reply", target=run_target(run),
                           changes={"reply": audit.change(None, {"request_id": question.request_id,
                                                                 "step_id": question.step_id})},
                           workspace_id=audit.workspace_of(run))

    answered = await core.engine.reply(trace_id, content=content, request_id=request_id, audit=entry)
    return {"request_id": answered.request_id, "step_id": answered.step_id}


RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED)


async def retry_run(
    core: Shared, *, user_id: str, is_admin: bool, trace_id: str, from_step: str | None = None
) -> WorkflowRun:
    """A new run of an ended run's steps and input (SPEC §7): every step that succeeded is
    reused (its row copied with `reused`, its provider never called), except `from_step`
    and its descendants; the rest runs. 409 for a run that has not ended or succeeded."""
    old = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id, action=Action.RUN)
    if old.status not in RETRYABLE:
        raise ConflictError(
            f"Only a failed, cancelled or interrupted run can be retried (this one is {old.status})."
        )
    ids = [step["id"] for step in old.steps]
    if from_step is not None and from_step not in ids:
        raise ValidationError.field("from_step", f"unknown step '{from_step}'; steps: {', '.join(ids)}")
    again = shape.dependents(old.steps, from_step) if from_step else set()
    rows = {r.path or r.step_id: r for r in await core.db.list(RunStep.select().where(RunStep.run == old.trace_id))}
    new_rows = []
    for sid in ids:
        row = rows.get(sid)
        if row is not None and row.status == StepStatus.SUCCEEDED and sid not in again:
            new_rows.append(_reused_row(row, sid))
        else:
            new_rows.append({"step_id": sid, "path": sid, "status": StepStatus.PENDING})
    reruns = {r["step_id"] for r in new_rows if r["status"] == StepStatus.PENDING} - again
    for path, row in rows.items():  # SPEC §8: a step that runs again reuses its finished items and iterations
        if path in ids or row.status != StepStatus.SUCCEEDED:
            continue
        try:
            top = instances.parse(path)[0].step_id
        except ValueError:
            continue
        if top in reruns:
            new_rows.append(_reused_row(row, path))
    new = NewRun(owner_id=old.owner_id, template_id=old.template_id, template_name=old.template_name,
                 template_version=old.template_version, steps=old.steps, spec=old.spec,
                 input_text=old.input, input_value=old.input_value, files=old.files,
                 retry_of=old.trace_id, step_rows=new_rows, workspace_id=old.workspace_id,
                 budget_pusd=carried_budget(old, None))  # the source's budget (SPEC §15b)
    async with core.db.atomic():
        [run] = await core.engine.store.create([new], claim=core.engine.claim_now)
        await audit.record(core, action="run.retry", target=run_target(run),
                           changes=run_changes(run, retry_of=old.trace_id, from_step=from_step),
                           workspace_id=audit.workspace_of(run))
    await core.engine.begin(run)
    return run


def _reused_row(row: RunStep, path: str) -> dict[str, Any]:
    """A succeeded instance copied into a retry: its output, no usage (this run called no
    provider for it; the source run keeps what it spent, so totals never count it twice)."""
    return {"step_id": row.step_id, "path": path, "status": StepStatus.SUCCEEDED,
            "reused": True, "attempt": row.attempt, "output": row.output, "output_value": row.output_value,
            "reuse_key": row.reuse_key, "usage": None, "started_at": row.started_at, "finished_at": row.finished_at}


# --- events ------------------------------------------------------------------------------


async def open_stream(
    core: Shared, *, user_id: str, is_admin: bool, trace_id: str, last_event_id: int
) -> WorkflowRun | None:
    """The run whose stream the caller may read, or None when `last_event_id` is already
    its terminal event (the stream has nothing more: 204)."""
    run = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    last = await reads.last_event(core.db, trace_id)
    if last is not None and last.terminal and last_event_id >= last.seq:
        return None
    return run


async def list_events(
    core: Shared, *, user_id: str, is_admin: bool, trace_id: str, after: int = 0,
    limit: int = EVENTS_MAX,
) -> tuple[list[Event], int | None]:
    """Up to `limit` stored events of a run after `after` (a JSON alternative to the
    stream), and the `after` of the next page (None when these were the last)."""
    await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    events = await reads.stored_events(core.db, trace_id, after=after, limit=limit + 1)
    if len(events) <= limit:
        return events, None
    return events[:limit], events[limit - 1].seq
