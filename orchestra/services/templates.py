"""Workflow templates (SPEC §4): validation, access rules, create, read, update, delete.

A template is a list of steps `{id, agent, prompt, depends_on}`. Its owner manages it;
a `shared` template (only administrators may share) is readable and runnable by every
user and managed by administrators; another user's private template is not found.
Its runs are services/runs.py.
"""

from __future__ import annotations

from typing import Any

from peewee import IntegrityError

from orchestra.db.models import (
    User,
    Worker,
    WorkflowRun,
    WorkflowTemplate,
    iso,
    name_key,
    utcnow,
)
from orchestra.db.workspace_models import Workspace
from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.language.model import NAME_MAX, PROMPT_MAX
from orchestra.language.typecheck import type_problems
from orchestra.language.validate import Checked
from orchestra.language.validate import check_template as check_template_language
from orchestra.services import audit, code_check, composition, version_store, workspace_scope
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action
from orchestra.vocabulary import ACTIVE

OPTION_FIELDS = ("input_schema", "limits", "output", "output_schema", "expose")  # template-level language options


# --- template validation ----------------------------------------------------------------


def add_problem(problems: list[dict[str, str]], field: str, problem: str) -> None:
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
    template_id: str | None = None, run_code: bool = False, workspace_id: str | None = None,
) -> Checked:
    """Every problem of a template (language.validate, plus whether each worker is one
    of the template's workspace, each secret exists and each child template may be
    called: see composition.py), without storing anything: `POST /template/check` and
    saves use it.
    `template_id`: the template being replaced (a child must not call it back);
    `run_code`: also run each code step on examples (`template check`, never a save);
    `workspace_id`: the template's workspace (its workers are the ones its steps may
    name; its secrets too, with the instance-wide ones; None: the owner's personal one
    for workers)."""
    checked = check_template_language(steps, options)
    if not checked.problems:  # a template otherwise sound: do its expressions fit its types?
        for field, problem in type_problems(checked.steps, checked.options):
            add_problem(checked.problems, field, problem)
    if run_code and not checked.problems:
        for field, problem in await code_check.code_problems(core, checked):
            add_problem(checked.problems, field, problem)
    await composition.check_calls(core, checked, owner_id=owner_id, template_id=template_id,
                                  workspace_id=workspace_id)
    if checked.workers:
        await _resolve_workers(core, checked, owner_id=owner_id, workspace_id=workspace_id)
    return checked


async def draft_workspace(core: Shared, user_id: str, workspace_id: str | None) -> str:
    """The workspace a checked draft would be saved in (`template/check`): the one named
    (404 unless the caller is a member), else the caller's personal one."""
    return await workspace_scope.target(core, user_id, workspace_id, Action.READ)


async def _resolve_workers(core: Shared, checked: Checked, *, owner_id: str, workspace_id: str | None) -> None:
    """Rewrite each step's `agent.worker` (an id, or a name in any case) to the id of a
    worker of the template's workspace; add a problem naming the step's field for one
    that is not there (another workspace's reads as unknown) or a name two of the
    workspace's workers share (names are unique per user, not per workspace)."""
    reach, team = await workspace_scope.in_workspace(core, owner_id, workspace_id, Worker.owner,
                                                     Worker.workspace_id)
    refs = {ref for _field, ref, _agent in checked.workers}
    found = await core.db.list(Worker.select(Worker.id, Worker.name_key, Worker.owner).where(
        reach & (Worker.id.in_(refs) | Worker.name_key.in_({name_key(r) for r in refs}))))
    by_id = {w.id: w for w in found}
    by_name: dict[str, list[Worker]] = {}
    for worker in sorted(found, key=lambda w: w.id):
        by_name.setdefault(worker.name_key, []).append(worker)
    names: str | None = None  # the workspace's worker names, read only for an error
    for field, ref, agent in checked.workers:
        worker = by_id.get(ref)
        named = [] if worker is not None else by_name.get(name_key(ref), [])
        if len(named) > 1:
            add_problem(checked.problems, field, await _ambiguous(core, ref, named, team))
            continue
        worker = worker or (named[0] if named else None)
        if worker is None:
            if names is None:
                names = ", ".join(await _worker_names(core, reach)) or "none yet"
            add_problem(checked.problems, field, f"unknown worker {ref!r}: " + (
                f"not the id or name of a worker of the workspace '{team.name}' (its workers: {names})"
                if team is not None else f"not the id or name of one of your workers (yours: {names})"))
        else:
            agent["worker"] = worker.id  # a name is resolved once, here: runs use the id


async def _ambiguous(core: Shared, ref: str, workers: list[Worker], team: Workspace | None) -> str:
    """The problem of a worker name that two or more of the workspace's workers have."""
    owners = dict(await core.db.list(User.select(User.id, User.user_name)
                                     .where(User.id.in_(sorted({w.owner_id for w in workers}))).tuples()))
    each = ", ".join(f"{w.id} ({owners.get(w.owner_id, w.owner_id)}'s)" for w in workers)
    where = f"the workspace '{team.name}'" if team is not None else "this workspace"
    return (f"the worker name {ref!r} is ambiguous: {len(workers)} workers of {where} have it "
            f"(names are unique per user); name one by its id: {each}")


async def _worker_names(core: Shared, reach: Any, most: int = 20) -> list[str]:
    """The first `most` names (by name) of the workers `reach` covers, then "…" when
    there are more."""
    rows = await core.db.list(Worker.select(Worker.name).where(reach)
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
        "workspace_id": template.workspace_id,
        "steps": template.steps,
        **(template.spec or {}),
        "version": template.version,
        "created_at": iso(template.created_at),
        "updated_at": iso(template.updated_at),
    }


def _steps_of(step: Any) -> list[Any]:
    """A step's inner steps: a foreach's small workflow, a loop's."""
    inner = list(step.get("steps") or [])
    if isinstance(step.get("loop"), dict):
        inner += step["loop"].get("steps") or []
    return inner


def _worker_ids(steps: Any, found: set[str]) -> set[str]:
    for step in steps or []:
        if not isinstance(step, dict):
            continue
        agent = step.get("agent")
        if isinstance(agent, dict) and isinstance(agent.get("worker"), str):
            found.add(agent["worker"])
        _worker_ids(_steps_of(step), found)
    return found


def named_agent(agent: Any, names: dict[str, str]) -> Any:
    """One step's `agent` with its worker id replaced by the worker's name (when known)."""
    if isinstance(agent, dict) and agent.get("worker") in names:
        return {**agent, "worker": names[agent["worker"]]}
    return agent


def _named(steps: Any, names: dict[str, str]) -> Any:
    """`steps` with each `agent.worker` id replaced by that worker's current name (SPEC §7:
    a template reads back portable); a worker no longer there keeps its id."""
    shown = []
    for step in steps or []:
        if not isinstance(step, dict):
            shown.append(step)
            continue
        step = dict(step)
        if "agent" in step:
            step["agent"] = named_agent(step["agent"], names)
        if step.get("steps"):
            step["steps"] = _named(step["steps"], names)
        if isinstance(step.get("loop"), dict) and step["loop"].get("steps"):
            step["loop"] = {**step["loop"], "steps": _named(step["loop"]["steps"], names)}
        shown.append(step)
    return shown


async def worker_names(core: Shared, *step_lists: Any) -> dict[str, str]:
    """{worker_id: name} of every worker the step lists name, in one read."""
    ids: set[str] = set()
    for steps in step_lists:
        _worker_ids(steps, ids)
    if not ids:
        return {}
    rows = await core.db.list(Worker.select(Worker.id, Worker.name).where(Worker.id.in_(ids)))
    return {w.id: w.name for w in rows}


def with_worker_names(view: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A template (or version) view whose steps name workers by name."""
    return {**view, "steps": _named(view.get("steps"), names)} if names else view


async def template_views(core: Shared, templates: list[WorkflowTemplate]) -> list[dict[str, Any]]:
    """Templates as the API reads them back: `agent.worker` holds the worker's name."""
    names = await worker_names(core, *(t.steps for t in templates))
    return [with_worker_names(template_view(t), names) for t in templates]


async def named_view(core: Shared, template: WorkflowTemplate) -> dict[str, Any]:
    return (await template_views(core, [template]))[0]


def _name_taken(name: str) -> ConflictError:
    return ConflictError(f"You already have a template named '{name}' (names ignore case).")


async def _ensure_name_free(core: Shared, owner_id: str, name: str, except_id: str | None = None,
                            team_id: str | None = None) -> None:
    """A friendly early 409; the unique (owner, name_key) index decides under races. In a
    team workspace (`team_id`) a name is also one template of the workspace's."""
    mine = WorkflowTemplate.owner == owner_id
    if team_id is not None:
        mine = mine | (WorkflowTemplate.workspace_id == team_id)
    query = WorkflowTemplate.select(WorkflowTemplate.id).where(
        mine & (WorkflowTemplate.name_key == name_key(name))
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
    workspace_id: str | None = None,
) -> WorkflowTemplate:
    """Validate and store a template; 422 names every problem, 409 a duplicate name.
    `options`: the language's template-level fields (input_schema, limits, output).
    `workspace_id`: where it goes (an editor's there; default the owner's personal one)."""
    _check_share(shared, is_admin)
    workspace_id = await workspace_scope.target(core, owner_id, workspace_id, Action.EDIT)
    team = await workspace_scope.team(core, workspace_id)
    name = _clean_name(name)
    if len(description) > PROMPT_MAX:
        raise ValidationError.field("description", f"must be at most {PROMPT_MAX} characters long")
    checked = await check_template(core, owner_id=owner_id, steps=steps, options=options,
                                   workspace_id=workspace_id)
    if checked.problems:
        _raise(checked.problems)
    await _ensure_name_free(core, owner_id, name, team_id=team.id if team else None)
    template = WorkflowTemplate(
        owner=owner_id, name=name, description=description, steps=checked.steps,
        spec=checked.options or None, shared=shared, version=1, workspace_id=workspace_id,
    )
    return await _save_version(core, template, create=True, author_id=owner_id, before={})


def audited_fields(template: WorkflowTemplate) -> dict[str, Any]:
    """What an audit entry shows of a template's change (SPEC §16): its content is in
    its versions (GET …/versions/diff), so steps appear by their ids."""
    return {"name": template.name, "description": template.description, "shared": bool(template.shared),
            "steps": [step.get("id") for step in template.steps or [] if isinstance(step, dict)],
            "options": sorted(template.spec or {}), "version": template.version}


async def _save_version(core: Shared, template: WorkflowTemplate, *, create: bool, author_id: str,
                        before: dict[str, Any], action: str | None = None,
                        also: dict[str, Any] | None = None) -> WorkflowTemplate:
    """Save the template, its new immutable version and its audit entry in one
    transaction (SPEC §13, §16): a refused save makes no version and no entry."""
    async with core.write_transaction():
        template.version = await version_store.next_number(core, template, create=create)
        await _save_template(template, create=create)
        await version_store.record(core, template, author_id=author_id)
        await audit.record(
            core, action=action or ("template.create" if create else "template.update"),
            target=audit.target("template", template.id, template.name),
            changes={**audit.diff(before, audited_fields(template)), **(also or {})},
            workspace_id=audit.workspace_of(template))
    await templates_changed(core)
    return template


async def templates_changed(core: Shared) -> None:
    """Tell every process that templates changed: MCP tool lists follow (SPEC §14)."""
    await core.signals.notify("cache", "workflow_template")


async def list_templates(
    core: Shared, *, user_id: str, limit: int = DEFAULT_LIMIT, cursor: str | None = None,
    workspace_id: str | None = None,
) -> Page[WorkflowTemplate]:
    """A page of the caller's templates, every shared one and those of the caller's team
    workspaces, oldest first; `workspace_id`: that workspace's only (404 for a non-member)."""
    workspace_id = workspace_scope.within_key(workspace_id)  # a key's request: its workspace's
    personal, teams = await workspace_scope.listed(core, user_id, workspace_id)
    if workspace_id is None:
        where = (WorkflowTemplate.owner == user_id) | (WorkflowTemplate.shared == True)  # noqa: E712
        if teams:
            where = where | WorkflowTemplate.workspace_id.in_(teams)
    elif personal:
        where = (WorkflowTemplate.owner == user_id) & (
            (WorkflowTemplate.workspace_id == workspace_id) | WorkflowTemplate.workspace_id.is_null())
    else:
        where = WorkflowTemplate.workspace_id == teams[0]
    query = WorkflowTemplate.select().where(where)
    return await keyset_page(
        core.db, query, kind="template", at=WorkflowTemplate.created_at, key=WorkflowTemplate.id,
        limit=limit, cursor=cursor,
    )


async def get_template(
    core: Shared, *, user_id: str, is_admin: bool, template_id: str, write: bool = False,
    action: Action = Action.READ,
) -> WorkflowTemplate:
    """A template the caller may read (own or shared), or may change (`write`). A shared
    template is changed, restored or deleted by ADMINISTRATOR+ only, its owner included:
    `is_admin` is the caller's role at the moment of the call (SPEC §15b), so an owner
    demoted since sharing it can no longer change what other users run. In a team
    workspace the caller's role there decides (`action`: read, run; `write`: edit)."""
    template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)
    missing = NotFoundError(f"No template has the id '{template_id}'.")
    if template is None:
        raise missing
    team = await workspace_scope.resource_team(core, template.workspace_id, template.owner_id, missing,
                                               shared=template.shared and not write)
    if team is not None:
        if write or not template.shared:  # a shared one is readable and runnable by every user
            await workspace_scope.require_in(core, user_id, team, Action.EDIT if write else action, missing)
    elif template.owner_id != user_id and not template.shared:
        raise missing
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
    restored_from: int | None = None,
) -> WorkflowTemplate:
    """Replace a template's name, description, steps, options (and `shared`,
    administrators only). `restored_from`: the version this save restores (its entry is
    `template.restore`)."""
    template = await get_template(
        core, user_id=user_id, is_admin=is_admin, template_id=template_id, write=True
    )
    before = audited_fields(template)
    if shared is not None and shared != template.shared:
        if not is_admin:
            raise PermissionDeniedError("Only an ADMINISTRATOR or above may change `shared`.")
        template.shared = shared
    template.name = _clean_name(name)
    if len(description) > PROMPT_MAX:
        raise ValidationError.field("description", f"must be at most {PROMPT_MAX} characters long")
    template.description = description
    checked = await check_template(core, owner_id=template.owner_id, steps=steps, options=options,
                                   template_id=template.id,
                                   workspace_id=await workspace_scope.workspace_of_template(core, template))
    if checked.problems:
        _raise(checked.problems)
    template.steps, template.spec = checked.steps, checked.options or None
    team = await workspace_scope.team(core, template.workspace_id)
    await _ensure_name_free(core, template.owner_id, template.name, except_id=template.id,
                            team_id=team.id if team else None)
    template.updated_at = utcnow()
    if restored_from is None:
        return await _save_version(core, template, create=False, author_id=user_id, before=before)
    return await _save_version(core, template, create=False, author_id=user_id, before=before,
                               action="template.restore",
                               also={"restored_from": audit.change(None, restored_from)})


async def delete_template(core: Shared, *, user_id: str, is_admin: bool, template_id: str) -> None:
    """Delete a template; its runs keep their own copy of the steps."""
    template = await get_template(
        core, user_id=user_id, is_admin=is_admin, template_id=template_id, write=True
    )
    async with core.write_transaction():
        if core.is_postgres:
            # The delete sets its runs' template to NULL. Its unfinished runs are locked
            # first, in the order every writer of several runs locks them (deepest first):
            # a run's own write waits for the delete, or the delete for it, never both
            # (a deadlock that PostgreSQL ended by failing the run's write).
            await core.db.list(
                WorkflowRun.select(WorkflowRun.trace_id)
                .where((WorkflowRun.template == template.id) & WorkflowRun.status.in_(list(ACTIVE)))
                .order_by(WorkflowRun.depth.desc(), WorkflowRun.trace_id).for_update())
        deleted = await core.db.aexecute(WorkflowTemplate.delete().where(WorkflowTemplate.id == template.id))
        if deleted:
            await audit.record(core, action="template.delete",
                               target=audit.target("template", template.id, template.name),
                               changes=audit.diff(audited_fields(template), {}),
                               workspace_id=audit.workspace_of(template))
    await templates_changed(core)
