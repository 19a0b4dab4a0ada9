"""Workflow templates and runs (SPEC §4): validation, access rules, start, cancel, reply.

A template is a list of steps `{id, agent, prompt, depends_on}`. Its owner manages it;
a `shared` template (only administrators may share) is readable and runnable by every
user and managed by administrators; another user's private template is not found.
Runs belong to their starter; an administrator may read, cancel and answer any run.
Execution itself is the engine (`orchestra.engine`, reached as `core.engine`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from peewee import IntegrityError

from orchestra.db.models import (
    RunStep,
    Upload,
    Worker,
    WorkflowRun,
    WorkflowTemplate,
    iso,
    name_key,
    utcnow,
)
from orchestra.engine import instances, reads
from orchestra.engine.run_task import step_output
from orchestra.engine.sizes import check_reply_size
from orchestra.engine.store.events import Event
from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.language import schemas, shape
from orchestra.language.model import NAME_MAX, PROMPT_MAX
from orchestra.language.typecheck import type_problems
from orchestra.language.validate import Checked
from orchestra.language.validate import check_template as check_template_language
from orchestra.services import composition, run_starts, spend, version_store
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page
from orchestra.services.run_starts import StartKey
from orchestra.services.shared import Shared
from orchestra.vocabulary import FINISHED, EventKind, RunStatus, StepStatus

EVENTS_MAX = 1000  # events in one page of GET /run/{id}/events
OPTION_FIELDS = ("input_schema", "limits", "output", "output_schema", "expose")  # template-level language options


# --- template validation ----------------------------------------------------------------


def _problem(problems: list[dict[str, str]], field: str, problem: str) -> None:
    problems.append({"field": field, "problem": problem})


def _raise(problems: list[dict[str, str]]) -> None:
    summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    raise ValidationError(f"Invalid template: {summary}{more}.", detail=problems)


def _clean_name(name: str) -> str:
    name = name.strip()
    if not 1 <= len(name) <= NAME_MAX:
        raise ValidationError.field("name", f"must be 1 to {NAME_MAX} characters long")
    return name


async def check_template(
    core: Shared, *, owner_id: str, steps: Any, options: dict[str, Any] | None = None,
    template_id: str | None = None,
) -> Checked:
    """Every problem of a template (language.validate, plus whether each worker is
    the owner's, each secret exists and each child template may be called: see
    composition.py), without storing anything: `POST /template/check` and saves use it.
    `template_id`: the template being replaced (a child must not call it back)."""
    checked = check_template_language(steps, options)
    if not checked.problems:  # a template otherwise sound: do its expressions fit its types?
        for field, problem in type_problems(checked.steps, checked.options):
            _problem(checked.problems, field, problem)
    await composition.check_calls(core, checked, owner_id=owner_id, template_id=template_id)
    if not checked.workers:
        return checked
    refs = {ref for _field, ref, _agent in checked.workers}
    named = await core.db.list(Worker.select(Worker.id, Worker.name_key).where(
        (Worker.owner == owner_id) & (Worker.id.in_(refs) | Worker.name_key.in_({name_key(r) for r in refs}))))
    by_id = {w.id: w for w in named}
    by_name = {w.name_key: w for w in named}
    names: str | None = None  # the owner's worker names, read only for an error
    for field, ref, agent in checked.workers:
        worker = by_id.get(ref) or by_name.get(name_key(ref))
        if worker is None:
            if names is None:
                names = ", ".join(await _worker_names(core, owner_id)) or "none yet"
            _problem(checked.problems, field,
                     f"unknown worker {ref!r}: not the id or name of one of your workers (yours: {names})")
        else:
            agent["worker"] = worker.id  # a name is resolved once, here: runs use the id
    return checked


async def _worker_names(core: Shared, owner_id: str, most: int = 20) -> list[str]:
    """The owner's first `most` worker names (by name), then "…" when there are more."""
    rows = await core.db.list(Worker.select(Worker.name).where(Worker.owner == owner_id)
                              .order_by(Worker.name_key).limit(most + 1))
    names = [w.name for w in rows[:most]]
    return names + (["…"] if len(rows) > most else [])


async def validate_steps(core: Shared, *, owner_id: str, steps: list[Any],
                         options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Normalised steps, or one 422 listing every problem (shape, ids, agents, references,
    cycles, expressions, schemas)."""
    checked = await check_template(core, owner_id=owner_id, steps=steps, options=options)
    if checked.problems:
        _raise(checked.problems)
    return checked.steps


# --- templates ---------------------------------------------------------------------------


def template_view(template: WorkflowTemplate) -> dict[str, Any]:
    return {
        "template_id": template.id,
        "name": template.name,
        "description": template.description,
        "shared": bool(template.shared),
        "owner_id": template.owner_id,
        "steps": template.steps,
        **(template.spec or {}),
        "version": template.version,
        "created_at": iso(template.created_at),
        "updated_at": iso(template.updated_at),
    }


def _name_taken(name: str) -> ConflictError:
    return ConflictError(f"You already have a template named '{name}' (names ignore case).")


async def _ensure_name_free(core: Shared, owner_id: str, name: str, except_id: str | None = None) -> None:
    """A friendly early 409; the unique (owner, name_key) index decides under races."""
    query = WorkflowTemplate.select(WorkflowTemplate.id).where(
        (WorkflowTemplate.owner == owner_id) & (WorkflowTemplate.name_key == name_key(name))
    )
    if except_id:
        query = query.where(WorkflowTemplate.id != except_id)
    if await core.db.exists(query):
        raise _name_taken(name)


async def _save_template(template: WorkflowTemplate, *, create: bool) -> WorkflowTemplate:
    try:
        await template.asave(force_insert=create)
    except IntegrityError:  # the unique (owner, name_key) index: a concurrent write took the name
        raise _name_taken(template.name) from None
    return template


def _check_share(shared: bool, is_admin: bool) -> None:
    if shared and not is_admin:
        raise PermissionDeniedError("Only an ADMINISTRATOR or above may mark a template shared.")


async def create_template(
    core: Shared,
    *,
    owner_id: str,
    is_admin: bool,
    name: str,
    steps: list[Any],
    description: str = "",
    shared: bool = False,
    options: dict[str, Any] | None = None,
) -> WorkflowTemplate:
    """Validate and store a template; 422 names every problem, 409 a duplicate name.
    `options`: the language's template-level fields (input_schema, limits, output)."""
    _check_share(shared, is_admin)
    name = _clean_name(name)
    if len(description) > PROMPT_MAX:
        raise ValidationError.field("description", f"must be at most {PROMPT_MAX} characters long")
    checked = await check_template(core, owner_id=owner_id, steps=steps, options=options)
    if checked.problems:
        _raise(checked.problems)
    await _ensure_name_free(core, owner_id, name)
    template = WorkflowTemplate(
        owner=owner_id, name=name, description=description, steps=checked.steps,
        spec=checked.options or None, shared=shared, version=1,
    )
    return await _save_version(core, template, create=True, author_id=owner_id)


async def _save_version(core: Shared, template: WorkflowTemplate, *, create: bool,
                        author_id: str) -> WorkflowTemplate:
    """Save the template and its new immutable version in one transaction (SPEC §13):
    a refused save makes no version."""
    async with core.db.atomic():
        template.version = await version_store.next_number(core, template, create=create)
        await _save_template(template, create=create)
        await version_store.record(core, template, author_id=author_id)
    await templates_changed(core)
    return template


async def templates_changed(core: Shared) -> None:
    """Tell every process that templates changed: MCP tool lists follow (SPEC §14)."""
    await core.signals.notify("cache", "workflow_template")


async def list_templates(
    core: Shared, *, user_id: str, limit: int = DEFAULT_LIMIT, cursor: str | None = None
) -> Page[WorkflowTemplate]:
    """A page of the caller's templates and every shared one, oldest first."""
    query = WorkflowTemplate.select().where(
        (WorkflowTemplate.owner == user_id) | (WorkflowTemplate.shared == True)  # noqa: E712
    )
    return await keyset_page(
        core.db, query, kind="template", at=WorkflowTemplate.created_at, key=WorkflowTemplate.id,
        limit=limit, cursor=cursor,
    )


async def get_template(
    core: Shared, *, user_id: str, is_admin: bool, template_id: str, write: bool = False
) -> WorkflowTemplate:
    """A template the caller may read (own or shared), or may change (`write`). A shared
    template is changed, restored or deleted by ADMINISTRATOR+ only, its owner included:
    `is_admin` is the caller's role at the moment of the call (SPEC §15b), so an owner
    demoted since sharing it can no longer change what other users run."""
    template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)
    if template is None or (template.owner_id != user_id and not template.shared):
        raise NotFoundError(f"No template has the id '{template_id}'.")
    if write and template.shared and not is_admin:
        raise PermissionDeniedError("Only an ADMINISTRATOR or above may change a shared template.")
    return template


async def update_template(
    core: Shared,
    *,
    user_id: str,
    is_admin: bool,
    template_id: str,
    name: str,
    steps: list[Any],
    description: str = "",
    shared: bool | None = None,
    options: dict[str, Any] | None = None,
) -> WorkflowTemplate:
    """Replace a template's name, description, steps, options (and `shared`,
    administrators only)."""
    template = await get_template(
        core, user_id=user_id, is_admin=is_admin, template_id=template_id, write=True
    )
    if shared is not None and shared != template.shared:
        if not is_admin:
            raise PermissionDeniedError("Only an ADMINISTRATOR or above may change `shared`.")
        template.shared = shared
    template.name = _clean_name(name)
    if len(description) > PROMPT_MAX:
        raise ValidationError.field("description", f"must be at most {PROMPT_MAX} characters long")
    template.description = description
    checked = await check_template(core, owner_id=template.owner_id, steps=steps, options=options,
                                   template_id=template.id)
    if checked.problems:
        _raise(checked.problems)
    template.steps, template.spec = checked.steps, checked.options or None
    await _ensure_name_free(core, template.owner_id, template.name, except_id=template.id)
    template.updated_at = utcnow()
    return await _save_version(core, template, create=False, author_id=user_id)


async def delete_template(core: Shared, *, user_id: str, is_admin: bool, template_id: str) -> None:
    """Delete a template; its runs keep their own copy of the steps."""
    template = await get_template(
        core, user_id=user_id, is_admin=is_admin, template_id=template_id, write=True
    )
    await core.db.aexecute(WorkflowTemplate.delete().where(WorkflowTemplate.id == template.id))
    await templates_changed(core)


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
                                      template_id=template_id)
    pinned = await version_store.for_run(core, template, version)
    spec = pinned.spec or {}
    budget = spend.run_budget(spec, budget_usd)
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
            _problem(problems, f"files.{i}", f"unknown file '{file_id}' (not one of your uploads)")
        else:
            attached.append({"file_id": upload.id, "filename": upload.filename})
    if problems:
        raise ValidationError(f"Invalid files: {problems[0]['problem']}.", detail=problems)
    claim = core.engine.claim_now()  # with room here, stored claimed: it starts at once
    async with core.db.atomic():
        run = await WorkflowRun.acreate(
            **claim,
            owner=user_id,
            template=template.id,
            template_name=pinned.name,
            template_version=pinned.version,
            steps=pinned.steps,
            spec=pinned.spec,
            input=input_text,
            input_value=input_value,
            files=attached,
            status=RunStatus.QUEUED,
            trace_parent=trace_parent,
            budget_pusd=budget,
            trigger=trigger,
        )
        if remember is not None:
            await run_starts.remember(core, remember, run.trace_id)
        if pinned.steps:  # one statement for every step row
            await core.db.aexecute(RunStep.insert_many([
                {"run": run.trace_id, "step_id": step["id"], "path": step["id"], "status": StepStatus.PENDING}
                for step in pinned.steps
            ]))
    if claim:
        await core.engine.adopt(run)
    else:
        await core.engine.submit(run.trace_id)
    return run


async def list_runs(
    core: Shared, *, user_id: str, is_admin: bool, all_users: bool = False,
    limit: int = DEFAULT_LIMIT, cursor: str | None = None,
) -> Page[WorkflowRun]:
    """A page of the caller's runs, newest first (`all_users`: everyone's, administrators only)."""
    if all_users and not is_admin:
        raise PermissionDeniedError("Only an ADMINISTRATOR or above may list every user's runs.")
    query = WorkflowRun.select()
    if not all_users:
        query = query.where(WorkflowRun.owner == user_id)
    return await keyset_page(
        core.db, query, kind="run", at=WorkflowRun.created_at, key=WorkflowRun.trace_id,
        limit=limit, cursor=cursor, newest_first=True,
    )


async def get_run(core: Shared, *, user_id: str, is_admin: bool, trace_id: str) -> WorkflowRun:
    """A run the caller may see: their own, or any run for an administrator."""
    run = await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id)
    if run is None or (run.owner_id != user_id and not is_admin):
        raise NotFoundError(f"No run has the trace_id '{trace_id}'.")
    return run


def run_summary(run: WorkflowRun) -> dict[str, Any]:
    return {
        "trace_id": run.trace_id,
        "template_id": run.template_id,
        "template_name": run.template_name,
        "owner_id": run.owner_id,
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
    steps = []
    for path in paths:
        row = rows.get(path)
        step_id = row.step_id if row else path
        step = defs.get(step_id, (0, {}))[1]
        steps.append({
            "step_id": step_id,
            "path": path,
            "agent": step.get("agent"),
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
    run = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    if run.status in FINISHED:
        raise ConflictError(f"The run has already ended ({run.status}).")
    await core.engine.cancel(trace_id, reason="The run was cancelled by request.")
    # its child runs (SPEC §14) at once, wherever they run, rather than level by level
    await asyncio.gather(core.engine.cancel(trace_id, reason="The run was cancelled by request."),
                         core.engine.cancel_descendants(trace_id, f"Its parent run {trace_id} was cancelled."))
    return await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)


async def reply(
    core: Shared, *, user_id: str, is_admin: bool, trace_id: str, content: Any, request_id: str | None = None
) -> dict[str, str]:
    """Answer the question a waiting run asked; 409 when it waits for none (or not this one),
    422 when the answer does not fit the step's output_schema, 413 when it is larger than
    a step's output may be (the question stays open)."""
    await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    check_reply_size(content, limit=core.settings.step_output_max_bytes)
    answered = await core.engine.reply(trace_id, content=content, request_id=request_id)
    return {"request_id": answered.request_id, "step_id": answered.step_id}


RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED)


def _descendants(steps: list[dict[str, Any]], root: str) -> set[str]:
    found, changed = {root}, True
    while changed:
        changed = False
        for step in steps:
            if step["id"] not in found and found & set(step.get("depends_on") or []):
                found.add(step["id"])
                changed = True
    return found


async def retry_run(
    core: Shared, *, user_id: str, is_admin: bool, trace_id: str, from_step: str | None = None
) -> WorkflowRun:
    """A new run of an ended run's steps and input (SPEC §7): every step that succeeded is
    reused (its row copied with `reused`, its provider never called), except `from_step`
    and its descendants; the rest runs. 409 for a run that has not ended or succeeded."""
    old = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    if old.status not in RETRYABLE:
        raise ConflictError(
            f"Only a failed, cancelled or interrupted run can be retried (this one is {old.status})."
        )
    ids = [step["id"] for step in old.steps]
    if from_step is not None and from_step not in ids:
        raise ValidationError.field("from_step", f"unknown step '{from_step}'; steps: {', '.join(ids)}")
    again = _descendants(old.steps, from_step) if from_step else set()
    rows = {r.path or r.step_id: r for r in await core.db.list(RunStep.select().where(RunStep.run == old.trace_id))}
    async with core.db.atomic():
        run = await WorkflowRun.acreate(
            owner=old.owner_id, template=old.template_id, template_name=old.template_name,
            steps=old.steps, spec=old.spec, input=old.input, input_value=old.input_value,
            files=old.files, retry_of=old.trace_id, status=RunStatus.QUEUED,
            template_version=old.template_version,
            budget_pusd=spend.carried_budget(old, None),  # the source's budget (SPEC §15b)
        )
        new_rows = []
        for sid in ids:
            row = rows.get(sid)
            if row is not None and row.status == StepStatus.SUCCEEDED and sid not in again:
                new_rows.append(_reused_row(run.trace_id, row, sid))
            else:
                new_rows.append({"run": run.trace_id, "step_id": sid, "path": sid,
                                 "status": StepStatus.PENDING})
        reruns = {r["step_id"] for r in new_rows if r["status"] == StepStatus.PENDING} - again
        for path, row in rows.items():  # SPEC §8: a step that runs again reuses its finished items and iterations
            if path in ids or row.status != StepStatus.SUCCEEDED:
                continue
            try:
                top = instances.parse(path)[0].step_id
            except ValueError:
                continue
            if top in reruns:
                new_rows.append(_reused_row(run.trace_id, row, path))
        if new_rows:  # insert_many takes its columns from the first row: give every row all of them
            new_rows = [{"reused": False, "attempt": 1, "output": None, "output_value": None, "usage": None,
                         "reuse_key": None, "started_at": None, "finished_at": None, **row} for row in new_rows]
            await core.db.aexecute(RunStep.insert_many(new_rows))
    await core.engine.submit(run.trace_id)
    return run


def _reused_row(trace_id: str, row: RunStep, path: str) -> dict[str, Any]:
    """A succeeded instance copied into a retry: its output, no usage (this run called no
    provider for it; the source run keeps what it spent, so totals never count it twice)."""
    return {"run": trace_id, "step_id": row.step_id, "path": path, "status": StepStatus.SUCCEEDED,
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
