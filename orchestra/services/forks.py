"""Forks (SPEC §13): a new run from another's finished work, re-paying nothing reused.

`POST /run/{trace_id}/fork {from_step?, input?, outputs?, version?}` checks the request,
decides from the template's dependency graph and each step's rendered inputs which of
the source's instances are reused (`fork_plan`), and stores the new run with those
instances already `succeeded` (`reused`, their outputs copied, no usage: the source run
keeps what it spent) and the overridden steps with their new outputs, before it is
queued. The engine resumes from stored instances, so it runs only what is left, and
announces each copied instance with `step_reused {source_trace_id}`; each call it then
reaches is reused at run time when the source made the same call (engine/reuse.py),
except `from_step` and what is downstream of it (`forked_from.again`).
"""

from __future__ import annotations

from typing import Any

from orchestra.db.models import RunStep, WorkflowRun, WorkflowTemplate
from orchestra.engine.records import output_fields
from orchestra.engine.run_task import step_output
from orchestra.engine.sizes import check_reply_size
from orchestra.engine.store.creation import NewRun, carried_budget
from orchestra.errors import NotFoundError, PermissionDeniedError, ValidationError
from orchestra.language import schemas, shape
from orchestra.services import audit, fork_outputs, runs, templates, version_store
from orchestra.services.fork_plan import ForkKeys, Planner, Record, Source, run_again
from orchestra.services.shared import Shared
from orchestra.services.template_diff import steps_by_id
from orchestra.services.workspace_rights import Action
from orchestra.vocabulary import StepStatus

UNSET: Any = object()  # `input` not sent: the source's input
PROBLEMS_MAX = 50  # problems listed for one fork's outputs


def downstream(steps: list[dict[str, Any]], root: str) -> set[str]:
    """`root`'s top-level step (itself, or the container it is inside) and every
    top-level step that depends on it, directly or through others."""
    top = root
    for step in steps:
        if any(inner["id"] == root for inner, _d, _w in shape.walk([step])):
            top = step["id"]
    return shape.dependents(steps, top)


async def _fork_steps(core: Shared, source: WorkflowRun, version: int | None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any], str, int | None]:
    """(steps, spec, template name, version) the fork runs: the source's own, or
    `version` of its template (404 when the template or that version is gone)."""
    if version is None:
        return source.steps, source.spec or {}, source.template_name, source.template_version
    template = None
    if source.template_id is not None:
        template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == source.template_id)
    if template is None:
        raise NotFoundError("The run's template was deleted, and its versions with it: a fork can "
                            "only run the run's own steps (leave out `version`).")
    # the fork is the source owner's run: the version must be one that owner may run
    template = await templates.get_template(core, user_id=source.owner_id, is_admin=False, template_id=template.id)
    pinned = await version_store.for_run(core, template, version)
    return pinned.steps, pinned.spec or {}, pinned.name, pinned.version


async def _check_input(core: Shared, value: Any, spec: dict[str, Any]) -> list[dict[str, str]]:
    if "input_schema" in spec:
        return await schemas.check(value, spec["input_schema"], root="input",
                                   sandbox=core.engine.request_sandbox)
    if not isinstance(value, str):
        return [{"field": "input", "problem": "must be a string (this template has no input_schema)"}]
    return []


async def _check_outputs(core: Shared, steps: list[dict[str, Any]], outputs: dict[str, Any],
                         again: set[str], from_step: str | None = None) -> list[dict[str, str]]:
    """Each overridden output: a top-level step not run again, its value of the step's
    kind (fork_outputs.py), no larger than a step's output may be."""
    top = {step["id"]: step for step in steps}
    inner = set(steps_by_id(steps)) - set(top)
    problems: list[dict[str, str]] = []
    for sid, value in outputs.items():
        if len(problems) >= PROBLEMS_MAX:  # a hostile body of many unknown ids: enough said
            break
        field = f"outputs.{sid[:64]}"
        step = top.get(sid)
        if step is None:
            problem = ("is inside a foreach or loop: only a top-level step's output can be set"
                       if sid in inner else f"unknown step {sid[:64]!r}")
            problems.append({"field": field, "problem": problem})
        elif sid == from_step:
            problems.append({"field": field, "problem": "is from_step, which runs again: to set its output "
                             "instead, leave from_step out (the CLI's --from); what reads it runs again then"})
        elif sid in again:
            problems.append({"field": field, "problem": "is from_step or downstream of it: it runs again"})
        else:
            problems += await fork_outputs.check(core, step, value, field)
        if not problems:
            check_reply_size(value, limit=core.settings.step_output_max_bytes)
    return problems


def _copied(row: RunStep) -> dict[str, Any]:
    """A source instance copied into the fork: its output, no usage."""
    return {"step_id": row.step_id, "path": row.path or row.step_id,
            "status": StepStatus.SUCCEEDED, "reused": True, "attempt": row.attempt,
            "output": row.output, "output_value": row.output_value, "reuse_key": row.reuse_key,
            "started_at": row.started_at, "finished_at": row.finished_at}


def _agent_lookup(core: Shared) -> Any:
    """An AgentRef → the worker's or node's configuration now (None: gone)."""

    async def lookup(agent: Any) -> Any:
        if agent.worker is not None:
            return await core.agent_cache.worker(agent.worker)
        return await core.agent_cache.node(agent.node)

    return lookup


async def fork_run(
    core: Shared, *, user_id: str, is_admin: bool, trace_id: str, from_step: str | None = None,
    input: Any = UNSET, outputs: dict[str, Any] | None = None, version: int | None = None,
    trace_parent: str | None = None,
) -> WorkflowRun:
    """A new run of the source's owner that reuses every source instance the plan allows
    (the source may still be active: what has succeeded so far counts)."""
    source = await runs.get_run(core, user_id=user_id, is_admin=is_admin, trace_id=trace_id,
                                action=Action.RUN)
    if source.owner_id != user_id:
        # an administrator may fork anyone's run (it stays the owner's), but not choose
        # what it runs or reads (SPEC §15b): only the owner sets these
        chosen = [name for name, value in (("version", version is not None), ("input", input is not UNSET),
                                           ("outputs", bool(outputs))) if value]
        if chosen:
            raise PermissionDeniedError(
                f"Only the run's owner may set {', '.join(f'`{n}`' for n in chosen)} on a fork; "
                "fork it without them, or ask its owner.")
    steps, spec, name, number = await _fork_steps(core, source, version)
    ids = steps_by_id(steps)
    if from_step is not None and from_step not in ids:
        listed = ", ".join(list(ids)[:50])
        raise ValidationError.field("from_step", f"unknown step {from_step[:64]!r}; steps: {listed}")
    outputs = dict(outputs or {})
    new_input = runs.run_input(source) if input is UNSET else input
    again = downstream(steps, from_step) if from_step is not None else set()
    problems = await _check_input(core, new_input, spec)
    problems += await _check_outputs(core, steps, outputs, again, from_step)
    if problems:
        raise ValidationError(f"The fork cannot start: {schemas.describe(problems)}.", detail=problems)
    rows = await core.db.list(RunStep.select().where(RunStep.run == source.trace_id))
    by_path = {row.path or row.step_id: row for row in rows}
    again = run_again(steps, from_step)
    records = {path: Record(row.status, step_output(row), row.reuse_key) for path, row in by_path.items()}
    planner = Planner(
        Source(records, steps_by_id(source.steps), runs.run_input(source), source.files or []),
        forced=again, overrides=outputs, keys=ForkKeys(source.files or [], _agent_lookup(core)),
        sandbox=core.engine.request_sandbox,
    )
    plan = await planner.run(steps, new_input)
    structured = "input_schema" in spec
    reused = {path: _copied(by_path[path]) for path in plan.reused}
    new_rows = []
    for step in steps:
        sid = step["id"]
        if sid in outputs:
            fields = output_fields(outputs[sid], structured="output_schema" in step
                                   or not isinstance(outputs[sid], str))
            new_rows.append({"step_id": sid, "path": sid, "status": StepStatus.SUCCEEDED, "reused": True,
                             **fields})
        elif sid not in reused:
            new_rows.append({"step_id": sid, "path": sid, "status": StepStatus.PENDING})
    new_rows += reused.values()
    new = NewRun(
        owner_id=source.owner_id, template_id=source.template_id, template_name=name,
        template_version=number, steps=steps, spec=spec or None,
        input_text="" if structured else new_input, input_value=new_input if structured else None,
        files=source.files, trace_parent=trace_parent, step_rows=new_rows, workspace_id=source.workspace_id,
        forked_from={"trace_id": source.trace_id, "from_step": from_step, "outputs": list(outputs),
                     "again": sorted(again)},
        # the source's budget; onto another version, that version's if smaller (SPEC §15b)
        budget_pusd=carried_budget(source, None if number == source.template_version else spec),
    )
    async with core.db.atomic():
        [run] = await core.engine.store.create([new], claim=core.engine.claim_now)
        await audit.record(core, action="run.fork", target=runs.run_target(run),
                           changes=runs.run_changes(run, forked_from=source.trace_id, from_step=from_step),
                           workspace_id=audit.workspace_of(run))
    await core.engine.begin(run)
    return run
