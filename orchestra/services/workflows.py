"""Workflow templates and runs (SPEC §4): validation, access rules, start, cancel, reply.

A template is a list of steps `{id, agent, prompt, depends_on}`. Its owner manages it;
a `shared` template (only administrators may share) is readable and runnable by every
user and managed by administrators; another user's private template is not found.
Runs belong to their starter; an administrator may read, cancel and answer any run.
Execution itself is `orchestra.engine.executor`.
"""

from __future__ import annotations

import re
from typing import Any

from peewee import IntegrityError

from orchestra.core import Core
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
from orchestra.engine.executor import FINISHED, PLACEHOLDER, Engine
from orchestra.engine.log import Event
from orchestra.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from orchestra.services.paging import DEFAULT_LIMIT, Page, keyset_page

STEP_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STEPS = 50
PROMPT_MAX = 100_000
NAME_MAX = 128
EVENTS_MAX = 1000  # events in one page of GET /run/{id}/events


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


async def validate_steps(core: Core, *, owner_id: str, steps: list[Any]) -> list[dict[str, Any]]:
    """Normalised steps, or one 422 listing every problem (shape, ids, agents, references,
    cycles, placeholders)."""
    problems: list[dict[str, str]] = []
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        raise ValidationError.field("steps", f"must be a list of 1 to {MAX_STEPS} steps")
    clean: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, raw in enumerate(steps):
        where = f"steps.{i}"
        if not isinstance(raw, dict):
            _problem(problems, where, "must be an object {id, agent, prompt, depends_on}")
            continue
        step_id = raw.get("id")
        if not isinstance(step_id, str) or not STEP_ID.fullmatch(step_id):
            _problem(problems, f"{where}.id", "must be 1 to 64 letters, digits, '_' or '-'")
            step_id = None
        elif step_id in seen:
            _problem(problems, f"{where}.id", f"duplicate step id '{step_id}'")
        else:
            seen.add(step_id)
        agent = await _check_agent(core, owner_id, raw.get("agent"), f"{where}.agent", problems)
        prompt = raw.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            _problem(problems, f"{where}.prompt", "must be a non-empty string")
            prompt = ""
        elif len(prompt) > PROMPT_MAX:
            _problem(problems, f"{where}.prompt", f"must be at most {PROMPT_MAX} characters long")
        depends = raw.get("depends_on", [])
        if depends is None:
            depends = []
        if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
            _problem(problems, f"{where}.depends_on", "must be a list of step ids")
            depends = []
        unknown_keys = sorted(set(raw) - {"id", "agent", "prompt", "depends_on"})
        if unknown_keys:
            _problem(problems, f"{where}.{unknown_keys[0]}", "is not a step field")
        clean.append(
            {"id": step_id, "agent": agent, "prompt": prompt, "depends_on": list(dict.fromkeys(depends))}
        )
    _check_graph(clean, problems)  # also after other problems: one 422 names them all
    if problems:
        _raise(problems)
    return clean


async def _check_agent(core: Core, owner_id: str, agent: Any, field: str, problems: list) -> dict:
    from orchestra.services.agents import NODE_SPECS

    shape = 'must be {"worker": worker_id}, {"node": name} or {"human": true}'
    if not isinstance(agent, dict) or len(agent) != 1:
        _problem(problems, field, shape)
        return {}
    (kind, value), = agent.items()
    if kind == "human":
        if value is not True:
            _problem(problems, field, shape)
        return {"human": True}
    if kind == "node":
        if not isinstance(value, str) or value not in NODE_SPECS:
            _problem(problems, f"{field}.node",
                     f"unknown system node {value!r}; nodes: {', '.join(NODE_SPECS)}")
        return {"node": value}
    if kind == "worker":
        worker = None
        if isinstance(value, str):
            worker = await Worker.aget_or_none((Worker.id == value) & (Worker.owner == owner_id))
        if worker is None:
            _problem(problems, f"{field}.worker", f"unknown worker {value!r} (not one of yours)")
        return {"worker": value}
    _problem(problems, field, shape)
    return {}


def _check_graph(steps: list[dict[str, Any]], problems: list) -> None:
    """Unknown dependencies, cycles, and placeholders naming steps that are not ancestors.

    Every check runs, whatever the others found (docs/api.md: one 422 lists every
    problem): the graph is built from the steps whose id is valid (the first of a
    duplicated id), with only the dependencies that name such a step.
    """
    ids = {s["id"] for s in steps if s["id"] is not None}
    deps: dict[str, list[str]] = {}
    for i, step in enumerate(steps):
        known = []
        for dep in step["depends_on"]:
            if dep not in ids:
                _problem(problems, f"steps.{i}.depends_on", f"unknown step '{dep}'")
            elif dep == step["id"]:
                _problem(problems, f"steps.{i}.depends_on", f"step '{dep}' depends on itself")
            else:
                known.append(dep)
        step["_known"] = known
        if step["id"] is not None and step["id"] not in deps:
            deps[step["id"]] = known
    cycle = _find_cycle(deps)
    if cycle:
        _problem(problems, "steps", f"the steps form a cycle: {' -> '.join(cycle)}")
    for i, step in enumerate(steps):
        known = step.pop("_known")
        ancestors = set(known).union(*(_ancestors(d, deps) for d in known))
        for match in PLACEHOLDER.finditer(step["prompt"]):
            name = match.group(1)
            if name == "input":
                continue
            parts = name.split(".")
            if len(parts) == 3 and parts[0] == "steps" and parts[2] == "output":
                ref = parts[1]
                if ref not in ids:
                    _problem(problems, f"steps.{i}.prompt", f"{{{{{name}}}}} names unknown step '{ref}'")
                elif ref not in ancestors or ref == step["id"]:
                    _problem(problems, f"steps.{i}.prompt",
                             f"{{{{{name}}}}} needs step '{ref}' in depends_on (directly or transitively)")
                continue
            _problem(problems, f"steps.{i}.prompt",
                     f"unknown placeholder {{{{{name}}}}}; use {{{{input}}}} or {{{{steps.<id>.output}}}}")


def _find_cycle(deps: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in deps[node]:
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _ancestors(step_id: str, deps: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    stack = list(deps[step_id])
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(deps[node])
    return seen


# --- templates ---------------------------------------------------------------------------


def template_view(template: WorkflowTemplate) -> dict[str, Any]:
    return {
        "template_id": template.id,
        "name": template.name,
        "description": template.description,
        "shared": bool(template.shared),
        "owner_id": template.owner_id,
        "steps": template.steps,
        "created_at": iso(template.created_at),
        "updated_at": iso(template.updated_at),
    }


def _name_taken(name: str) -> ConflictError:
    return ConflictError(f"You already have a template named '{name}' (names ignore case).")


async def _ensure_name_free(core: Core, owner_id: str, name: str, except_id: str | None = None) -> None:
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
    core: Core,
    *,
    owner_id: str,
    is_admin: bool,
    name: str,
    steps: list[Any],
    description: str = "",
    shared: bool = False,
) -> WorkflowTemplate:
    """Validate and store a template; 422 names every problem, 409 a duplicate name."""
    _check_share(shared, is_admin)
    name = _clean_name(name)
    if len(description) > PROMPT_MAX:
        raise ValidationError.field("description", f"must be at most {PROMPT_MAX} characters long")
    clean = await validate_steps(core, owner_id=owner_id, steps=steps)
    await _ensure_name_free(core, owner_id, name)
    template = WorkflowTemplate(
        owner=owner_id, name=name, description=description, steps=clean, shared=shared
    )
    return await _save_template(template, create=True)


async def list_templates(
    core: Core, *, user_id: str, limit: int = DEFAULT_LIMIT, cursor: str | None = None
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
    core: Core, *, user_id: str, is_admin: bool, template_id: str, write: bool = False
) -> WorkflowTemplate:
    """A template the caller may read (own or shared), or may change (`write`)."""
    template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == template_id)
    if template is None or (template.owner_id != user_id and not template.shared):
        raise NotFoundError(f"No template has the id '{template_id}'.")
    if write and template.owner_id != user_id and not is_admin:
        raise PermissionDeniedError("Only an ADMINISTRATOR or above may change a shared template.")
    return template


async def update_template(
    core: Core,
    *,
    user_id: str,
    is_admin: bool,
    template_id: str,
    name: str,
    steps: list[Any],
    description: str = "",
    shared: bool | None = None,
) -> WorkflowTemplate:
    """Replace a template's name, description, steps (and `shared`, administrators only)."""
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
    template.steps = await validate_steps(core, owner_id=template.owner_id, steps=steps)
    await _ensure_name_free(core, template.owner_id, template.name, except_id=template.id)
    template.updated_at = utcnow()
    return await _save_template(template, create=False)


async def delete_template(core: Core, *, user_id: str, is_admin: bool, template_id: str) -> None:
    """Delete a template; its runs keep their own copy of the steps."""
    template = await get_template(
        core, user_id=user_id, is_admin=is_admin, template_id=template_id, write=True
    )
    await core.db.aexecute(WorkflowTemplate.delete().where(WorkflowTemplate.id == template.id))


# --- runs --------------------------------------------------------------------------------


def engine_of(core: Core) -> Engine:
    """The one Engine of this Core (kept in core.extras["engine"]), built on first use with
    what it needs from the services: agents, tools, the upload reader, the signals."""
    engine = core.extras.get("engine")
    if engine is None:
        from orchestra.services import uploads
        from orchestra.services.agents import agent_cache, tool_registry

        async def read_upload(owner_id: str, file_id: str) -> str:
            return await uploads.read_text(core, owner_id=owner_id, file_id=file_id)

        engine = core.extras["engine"] = Engine(
            core,
            agents=agent_cache(core),
            registry=tool_registry(core),
            read_upload=read_upload,
            signals=core.signals,
            exclusive=not core.is_postgres,
        )

        async def _on_user_deleted(user_id: str) -> None:
            await engine.cancel_owner(user_id, reason="The run's user was deleted.")

        core.extras.setdefault("on_user_deleted", []).append(_on_user_deleted)
        core.extras.setdefault("on_close", []).append(engine.stop)
    return engine



async def start_run(
    core: Core,
    *,
    user_id: str,
    is_admin: bool,
    template_id: str,
    input: str = "",
    files: list[str] | None = None,
) -> WorkflowRun:
    """Store a `queued` run of a readable template and hand it to the engine."""
    template = await get_template(core, user_id=user_id, is_admin=is_admin, template_id=template_id)
    attached = []
    problems: list[dict[str, str]] = []
    for i, file_id in enumerate(dict.fromkeys(files or [])):
        upload = await Upload.aget_or_none((Upload.id == file_id) & (Upload.owner == user_id))
        if upload is None:
            _problem(problems, f"files.{i}", f"unknown file '{file_id}' (not one of your uploads)")
        else:
            attached.append({"file_id": upload.id, "filename": upload.filename})
    if problems:
        raise ValidationError(f"Invalid files: {problems[0]['problem']}.", detail=problems)
    async with core.db.atomic():
        run = await WorkflowRun.acreate(
            owner=user_id,
            template=template.id,
            template_name=template.name,
            steps=template.steps,
            input=input,
            files=attached,
            status="queued",
        )
        if template.steps:  # one statement for every step row
            await core.db.aexecute(RunStep.insert_many(
                [{"run": run.trace_id, "step_id": step["id"], "status": "pending"} for step in template.steps]
            ))
    await engine_of(core).submit(run.trace_id)
    return run


async def list_runs(
    core: Core, *, user_id: str, is_admin: bool, all_users: bool = False,
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


async def get_run(core: Core, *, user_id: str, is_admin: bool, trace_id: str) -> WorkflowRun:
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
    }


async def run_detail(core: Core, run: WorkflowRun) -> dict[str, Any]:
    """The run with each step's status, output, error, usage and times, and open questions."""
    rows = {r.step_id: r for r in await core.db.list(RunStep.select().where(RunStep.run == run.trace_id))}
    steps = []
    for step in run.steps:
        row = rows.get(step["id"])
        steps.append({
            "step_id": step["id"],
            "agent": step["agent"],
            "depends_on": step.get("depends_on", []),
            "status": row.status if row else "pending",
            "output": row.output if row else None,
            "error": row.error if row else None,
            "usage": row.usage if row else None,
            "started_at": iso(row.started_at) if row else None,
            "finished_at": iso(row.finished_at) if row else None,
        })
    return {
        **run_summary(run),
        "input": run.input,
        "files": run.files or [],
        "steps": steps,
        "pending_replies": await pending_replies(core, run),
        "last_seq": await engine_of(core).log.max_seq(run.trace_id),
    }


async def pending_replies(core: Core, run: WorkflowRun) -> list[dict[str, str]]:
    """`[{request_id, step_id, prompt}]` the run waits on, oldest first."""
    if run.status in FINISHED:
        return []
    return await engine_of(core).open_questions(run.trace_id)


async def cancel_run(core: Core, *, user_id: str, is_admin: bool, trace_id: str) -> WorkflowRun:
    """Cancel an unfinished run wherever it executes; 409 when it has already ended."""
    run = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    if run.status in FINISHED:
        raise ConflictError(f"The run has already ended ({run.status}).")
    await engine_of(core).cancel(trace_id, reason="The run was cancelled by request.")
    return await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)


async def reply(
    core: Core, *, user_id: str, is_admin: bool, trace_id: str, content: str, request_id: str | None = None
) -> dict[str, str]:
    """Answer the question a waiting run asked; 409 when it waits for none (or not this one)."""
    await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    answered = await engine_of(core).reply(trace_id, content=content, request_id=request_id)
    return {"request_id": answered.request_id, "step_id": answered.step_id}


# --- events ------------------------------------------------------------------------------


async def open_stream(
    core: Core, *, user_id: str, is_admin: bool, trace_id: str, last_event_id: int
) -> WorkflowRun | None:
    """The run whose stream the caller may read, or None when `last_event_id` is already
    its terminal event (the stream has nothing more: 204)."""
    run = await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    last = await engine_of(core).log.last_event(trace_id)
    if last is not None and last.terminal and last_event_id >= last.seq:
        return None
    return run


async def list_events(
    core: Core, *, user_id: str, is_admin: bool, trace_id: str, after: int = 0,
    limit: int = EVENTS_MAX,
) -> tuple[list[Event], int | None]:
    """Up to `limit` stored events of a run after `after` (a JSON alternative to the
    stream), and the `after` of the next page (None when these were the last)."""
    await get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id)
    events = await engine_of(core).log.stored(trace_id, after=after, limit=limit + 1)
    if len(events) <= limit:
        return events, None
    return events[:limit], events[limit - 1].seq
