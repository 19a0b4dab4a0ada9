"""`/api/v1/workflow`: templates, runs, cancel, reply and the SSE event stream."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from sanic import Blueprint, Request
from sanic.response import HTTPResponse, json

from orchestra.errors import PermissionDeniedError, ValidationError
from orchestra.language.model import EXPRESSION_MAX, MAX_STEPS, Expose, Step, TemplateLimits
from orchestra.money.amounts import POSITIVE_USD_JSON_SCHEMA, USD_JSON_SCHEMA
from orchestra.observability import tracing
from orchestra.services import run_starts, runs, templates
from orchestra.services import spend as spend_service
from orchestra.services.roles import Role
from orchestra.services.workspace_rights import Action
from orchestra.vocabulary import RunStatus
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.events import event_schema, stream_description
from orchestra.web.apidoc.operation import Link, documented, header, query
from orchestra.web.apidoc.rules import ID_PATTERN, amends, free_text, id_rule, rule, stripped
from orchestra.web.apidoc.workspace_shapes import NOT_A_MEMBER, WORKSPACE_FILTER
from orchestra.web.auth import protected
from orchestra.web.paging import (
    PAGE_ERRORS,
    count_arg,
    page_args,
    page_body,
    page_params,
    workspace_arg,
)
from orchestra.web.responses import SUCCESS
from orchestra.web.sse import parse_last_event_id, send_stream
from orchestra.web.validation import Body, parse_body

bp = Blueprint("workflow", url_prefix="/workflow")



_NULL = {"type": "null"}  # absent or null


@amends("Step")
def _step_kinds(schema: dict[str, Any]) -> None:
    """A step is one of four kinds, as the template service checks (validate.py): an agent
    or human step (agent and prompt), a loop (loop.steps instead), a foreach over an agent
    (foreach, agent, prompt) or a foreach over steps (foreach, steps, output)."""
    agent = {"agent": {"type": "object"}, "prompt": {"type": "string"}}
    schema["anyOf"] = [
        {"required": ["agent", "prompt"],
         "properties": {**agent, "foreach": _NULL, "loop": _NULL, "steps": False, "output": False}},
        {"required": ["loop"],
         "properties": {"loop": {"type": "object"}, "foreach": _NULL, "agent": False, "prompt": False,
                        "steps": False, "output": False}},
        {"required": ["foreach", "agent", "prompt"],
         "properties": {**agent, "foreach": {"type": "object"}, "loop": _NULL, "steps": False,
                        "output": False}},
        {"required": ["foreach", "steps"],
         "properties": {"foreach": {"type": "object"}, "steps": {"type": "array"}, "loop": _NULL,
                        "agent": False, "prompt": False}},
    ]


@amends("WorkerAgent")
def _worker_ref(schema: dict[str, Any]) -> None:
    """The id or the name of a worker of the template's workspace: not empty."""
    schema["properties"]["worker"].update(
        minLength=1, description="The id or the name (ignoring case) of a worker of the template's workspace.")


class TemplateDraft(Body):
    """What `template/check` reads: only the shapes pydantic checks are a 422 here; every
    problem of the steps and options is answered in the 200's `problems`."""

    name: str = rule(description="Not checked here (saving checks it).")
    description: str = ""
    steps: list[Any] = rule(description="Any steps: each problem is answered with its path.")
    shared: bool | None = None
    input_schema: dict[str, Any] | None = None
    limits: TemplateLimits | None = None
    output: str | None = None
    output_schema: dict[str, Any] | None = None
    expose: Expose | None = None

    def options(self) -> dict[str, Any]:
        """The language's template-level fields that were sent."""
        sent = {k: getattr(self, k) for k in templates.OPTION_FIELDS if getattr(self, k) is not None}
        for name in ("limits", "expose"):
            if name in sent:
                sent[name] = sent[name].model_dump(exclude_none=True)
        return sent


class CheckedDraft(TemplateDraft):
    workspace_id: str | None = id_rule(None, description="The workspace the template would belong to: its "
                                       "secrets are checked with the instance-wide ones (404 when you are not "
                                       "a member); default: your personal one.")


class TemplateBody(TemplateDraft):
    name: str = rule(
        description=f"1-{templates.NAME_MAX} characters (stripped); unique among your templates.",
        pattern=stripped(templates.NAME_MAX, controls=False),
    )
    description: str = rule("", **free_text(templates.PROMPT_MAX))
    steps: list[Any] = rule(
        description="The steps; checked by the template service with the Step model, so that "
        "one 422 lists every problem with its path (steps.2.when).",
        minItems=1, maxItems=MAX_STEPS, items=Step,
    )
    shared: bool | None = rule(None, description="Readable and runnable by every user (ADMINISTRATOR+).")


class NewTemplateBody(TemplateBody):
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need editor "
                                       "there; 404 when you are not a member); default: your personal one.")
    input_schema: dict[str, Any] | None = rule(
        None, description="JSON Schema (2020-12, at most 64 KiB, no remote $ref) of a run's input.",
    )
    limits: TemplateLimits | None = None
    output: str | None = rule(
        None, description="CEL expression: the run's output (default: the last step's).",
        maxLength=EXPRESSION_MAX,
    )
    output_schema: dict[str, Any] | None = rule(
        None, description="JSON Schema (2020-12, at most 64 KiB, no remote $ref) the run's output "
        "must satisfy (else the run fails naming the path); an MCP tool's outputSchema.",
    )
    expose: Expose | None = rule(None, description='`{"mcp": true}` offers the template as a tool '
                                 "of orchestra's MCP server (`/mcp`, SPEC §14).")


class RunBody(Body):
    template_id: str = id_rule(description="A template you may read (yours or shared).")
    input: Any = rule(
        "", description="The text {{input}} stands for; under the template's input_schema any "
        "JSON value that validates (422 names each violation: input.topics.2).",
    )
    files: list[str] | None = rule(None, description="Ids of your uploads, listed to agent steps.",
                                   items={"type": "string", "pattern": ID_PATTERN})
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="The template version to run "
                                "(default: the latest); an unknown one is a 404.")
    budget_usd: Any = rule(None, description=(
        "USD this run's model calls may cost at most (a number or decimal string, not negative); "
        "with the template's limits.budget_usd the smaller holds (SPEC §12)."),
        anyOf=[{"type": "null"}, *USD_JSON_SCHEMA["anyOf"]])


class BudgetBody(Body):
    add_usd: Any = rule(description=(
        "USD added to the budget of a run waiting_budget: a positive number or decimal string."),
        **POSITIVE_USD_JSON_SCHEMA)


class RetryBody(Body):
    from_step: str | None = rule(None, description="Also run this step and its descendants again.")


class ReplyBody(Body):
    content: Any = rule(
        description="The answer: text, or for a human step with output_schema the JSON value "
        "itself, which must validate (422 otherwise; the question stays open)."
    )
    request_id: str | None = rule(None, description="The question answered; default the oldest open one.")


_AFTER = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}
# run_event.seq is a 32-bit column: a larger "after" means "after every event" (PostgreSQL
# refuses such a parameter outright, which was a 500).
SEQ_MAX = 2**31 - 1
_TEMPLATE = {"template_id": "$response.body#/template_id"}
_TRACE = {"trace_id": "$response.body#/trace_id"}
_RUN_LINKS = {
    "Read": Link("workflow.get_run", _TRACE),
    "Events": Link("workflow.list_events", _TRACE),
    "Stream": Link("workflow.stream", _TRACE),
    "Reply": Link("workflow.reply", _TRACE, request_body={"content": "yes"}),
    "Cancel": Link("workflow.cancel_run", _TRACE),
    "Fork": Link("versions.fork", _TRACE),
}
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False, "": False}


def _who(request: Request) -> dict[str, Any]:
    principal = request.ctx.principal
    return {"user_id": principal.user_id, "is_admin": principal.is_admin}




def _workspace_arg(request: Request) -> str | None:
    return workspace_arg(request)


def _flag(request: Request, name: str) -> bool:
    """A yes/no query parameter; 422 for a value that is neither."""
    value = _FLAGS.get((request.args.get(name) or "").strip().lower())
    if value is None:
        raise ValidationError.field(name, "must be true or false (also 1/0, yes/no, on/off)")
    return value


# --- templates ------------------------------------------------------------------------


@bp.post("/template")
@documented(
    "Create a template", body=TemplateBody, response=out.Template, status=201,
    errors={
        403: "PermissionDeniedError: shared is for ADMINISTRATOR and above.",
        409: "ConflictError: you have a template of that name (ignoring case).",
    },
    links={
        "Read": Link("workflow.get_template", _TEMPLATE),
        "Update": Link("workflow.update_template", _TEMPLATE),
        "Delete": Link("workflow.delete_template", _TEMPLATE),
        "Run": Link("workflow.start_run", request_body={**_TEMPLATE, "input": "2 + 2"}),
        "Versions": Link("versions.list_versions", _TEMPLATE),
        "Version": Link("versions.get_version", {**_TEMPLATE, "number": "$response.body#/template/version"}),
        "Diff": Link("versions.diff", _TEMPLATE),
        "Restore": Link("versions.restore", {**_TEMPLATE, "number": "$response.body#/template/version"}),
    },
)
@protected(Role.USER, scope="template:write")
async def create_template(request: Request):
    body = parse_body(request, NewTemplateBody)
    principal = request.ctx.principal
    template = await templates.create_template(
        request.app.ctx.core,
        owner_id=principal.user_id,
        is_admin=principal.is_admin,
        name=body.name,
        description=body.description,
        steps=body.steps,
        shared=bool(body.shared),
        options=body.options(),
        workspace_id=body.workspace_id,
    )
    view = await templates.named_view(request.app.ctx.core, template)
    return json({"message": SUCCESS, "template_id": template.id, "template": view}, status=201)


@bp.post("/template/check")
@documented(
    "Check a template without saving it", body=CheckedDraft, response=out.TemplateCheck,
    description="Runs every save-time check (shapes, ids, references, cycles, expressions, "
    "schemas, the workspace's workers), then runs each top-level code step once on examples of its inputs "
    "(SPEC §17), and answers 200 with each problem and its path; nothing is stored. "
    "`orchestra template check FILE` uses it.",
    errors={404: NOT_A_MEMBER},
)
@protected(Role.USER, scope="template:read")
async def check_template(request: Request):
    body = parse_body(request, CheckedDraft)
    core, user_id = request.app.ctx.core, request.ctx.principal.user_id
    checked = await templates.check_template(
        core, owner_id=user_id, steps=body.steps, options=body.options(), run_code=True,
        workspace_id=await templates.draft_workspace(core, user_id, body.workspace_id),
    )
    return json({"message": SUCCESS, "valid": not checked.problems, "problems": checked.problems})


@bp.get("/template")
@documented(
    "List your templates, the shared ones and your workspaces', oldest first (paged)",
    response=out.TemplateList, errors={404: NOT_A_MEMBER, 422: PAGE_ERRORS},
    params=(*page_params("templates"), WORKSPACE_FILTER),
)
@protected(Role.USER, scope="template:read")
async def list_templates(request: Request):
    limit, cursor = page_args(request)
    page = await templates.list_templates(
        request.app.ctx.core, user_id=request.ctx.principal.user_id, limit=limit, cursor=cursor,
        workspace_id=_workspace_arg(request),
    )
    views = await templates.template_views(request.app.ctx.core, list(page.rows))
    return json(page_body("templates", views, page))


@bp.get("/template/<template_id:str>")
@documented("Read a template", response=out.Template)
@protected(Role.USER, scope="template:read")
async def get_template(request: Request, template_id: str):
    template = await templates.get_template(
        request.app.ctx.core, template_id=template_id, **_who(request)
    )
    view = await templates.named_view(request.app.ctx.core, template)
    return json({"message": SUCCESS, "template_id": template.id, "template": view})


@bp.put("/template/<template_id:str>")
@documented(
    "Replace a template", body=TemplateBody, response=out.Template,
    errors={
        403: "PermissionDeniedError: a shared template, or shared, changed by a non-administrator.",
        409: "ConflictError: you have a template of that name (ignoring case).",
    },
)
@protected(Role.USER, scope="template:write")
async def update_template(request: Request, template_id: str):
    body = parse_body(request, TemplateBody)
    template = await templates.update_template(
        request.app.ctx.core,
        template_id=template_id,
        name=body.name,
        description=body.description,
        steps=body.steps,
        shared=body.shared,
        options=body.options(),
        **_who(request),
    )
    view = await templates.named_view(request.app.ctx.core, template)
    return json({"message": SUCCESS, "template_id": template.id, "template": view})


@bp.delete("/template/<template_id:str>")
@documented(
    "Delete a template (its runs keep their steps)", response=out.TemplateDeleted,
    errors={403: "PermissionDeniedError: a shared template, deleted by a non-administrator."},
)
@protected(Role.USER, scope="template:write")
async def delete_template(request: Request, template_id: str):
    await templates.delete_template(request.app.ctx.core, template_id=template_id, **_who(request))
    return json({"message": SUCCESS, "template_id": template_id})


# --- runs -----------------------------------------------------------------------------


@bp.post("/run")
@documented(
    "Start a run of a template", body=RunBody, response=out.RunStarted, status=202,
    description="With an `Idempotency-Key` header, the same key (yours, within 24 hours) answers "
    "the first run's trace_id with 200 and the header `Idempotent-Replayed: true`, and starts "
    "nothing; racing duplicates on any number of processes start exactly one run.",
    extra_responses={200: "Idempotent-Replayed: this Idempotency-Key already started the run "
                          "named (body: message, trace_id, status now); nothing was started."},
    errors={403: "PermissionDeniedError: an API key limited to other templates.",
            404: "NotFoundError: no template you may read has this id, or it has no such version.",
            422: "ValidationError: the body, or an Idempotency-Key over 255 characters or used "
                 "with a different body."},
    links=_RUN_LINKS,
    params=(header("traceparent", "W3C trace context: the run's spans join this trace, in "
                   "whichever process executes it (ignored unless well-formed)."),
            header(run_starts.IDEMPOTENCY_HEADER, "Makes the start happen once: up to 255 characters "
                   "(no control characters; empty: no key), remembered per user for 24 hours.",
                   type="string", pattern=run_starts.KEY_PATTERN)),
)
@protected(Role.USER, scope="run:start")
async def start_run(request: Request):
    key = run_starts.idempotency_key(request.headers.get(run_starts.IDEMPOTENCY_HEADER))
    body = parse_body(request, RunBody)
    principal = request.ctx.principal
    if principal.key is not None and not principal.key.allows_template(body.template_id):
        raise PermissionDeniedError("This API key may not start runs of that template.")
    core = request.app.ctx.core
    remember = None
    if key is not None:
        remember = run_starts.StartKey(
            scope=f"user:{principal.user_id}", key=key,
            fingerprint=run_starts.fingerprint(body.model_dump(mode="json")))

    async def begin():
        return await runs.start_run(
            core, template_id=body.template_id, input=body.input, files=body.files,
            trace_parent=tracing.parent_for_run(request.headers), remember=remember,
            version=body.version, budget_usd=body.budget_usd, **_who(request),
        )

    if remember is None:
        run = await begin()
        return json({"message": SUCCESS, "trace_id": run.trace_id, "status": RunStatus.QUEUED},
                    status=202)
    started = await run_starts.start_once(core, remember, begin)
    if started.replayed:
        return json({"message": SUCCESS, "trace_id": started.trace_id, "status": started.status},
                    headers={"Idempotent-Replayed": "true"})
    return json({"message": SUCCESS, "trace_id": started.trace_id, "status": RunStatus.QUEUED},
                status=202)


@bp.get("/run")
@documented(
    "List your runs, newest first (paged)", response=out.RunList,
    errors={
        403: "PermissionDeniedError: all=true is for ADMINISTRATOR and above.",
        404: NOT_A_MEMBER,
        422: "ValidationError: limit or all out of range, or a cursor not of this list's form.",
    },
    params=(
        *page_params("runs"),
        query("all", "Every user's runs (ADMINISTRATOR and above).", type="boolean"),
        WORKSPACE_FILTER,
    ),
)
@protected(Role.USER, scope="run:read")
async def list_runs(request: Request):
    limit, cursor = page_args(request)
    page = await runs.list_runs(
        request.app.ctx.core, all_users=_flag(request, "all"), limit=limit, cursor=cursor,
        workspace_id=_workspace_arg(request), **_who(request),
    )
    return json(page_body("runs", [runs.run_summary(r) for r in page.rows], page))


@bp.get("/run/<trace_id:str>")
@documented("Read a run: status, steps, outputs, open questions", response=out.RunDetail)
@protected(Role.USER, scope="run:read")
async def get_run(request: Request, trace_id: str):
    core = request.app.ctx.core
    run = await runs.get_run(core, trace_id=trace_id, **_who(request))
    detail = await runs.run_detail(core, run)
    return json({"message": SUCCESS, **detail, "run": detail})


@bp.get("/run/<trace_id:str>/events")
@documented(
    "A run's stored events as JSON, oldest first (paged by seq)", response=out.EventList,
    errors={422: "ValidationError: after is not a non-negative integer, or limit is out of range."},
    params=(
        query("after", "Only events with a greater seq (default 0): the next_after of the previous page.",
              **_AFTER),
        query("limit", f"At most this many events (default and maximum {runs.EVENTS_MAX}).",
              type="integer", minimum=1, maximum=runs.EVENTS_MAX),
    ),
)
@protected(Role.USER, scope="run:read")
async def list_events(request: Request, trace_id: str):
    after = count_arg(request, "after", default=0, low=0, high=10**18 - 1)
    limit = count_arg(request, "limit", default=runs.EVENTS_MAX, low=1, high=runs.EVENTS_MAX)
    events, next_after = await runs.list_events(
        request.app.ctx.core, trace_id=trace_id, after=min(after, SEQ_MAX), limit=limit,
        **_who(request),
    )
    return json({"message": SUCCESS, "events": [e.as_dict() for e in events], "next_after": next_after})


@bp.post("/run/<trace_id:str>/retry")
@documented(
    "Retry an ended run, reusing the steps that succeeded", body=RetryBody, response=out.RunRetried,
    status=202,
    description="A new run of the same steps and input: every step that succeeded before is "
    "reused (reused: true, its output copied, its provider never called) except from_step and "
    "its descendants; the rest runs.",
    errors={409: "ConflictError: the run has not ended, or it succeeded.",
            422: "ValidationError: from_step is not a step of the run."},
    links=_RUN_LINKS,
)
@protected(Role.USER, scope="run:start")
async def retry_run(request: Request, trace_id: str):
    body = parse_body(request, RetryBody) if (request.body or b"").strip() else RetryBody()
    key = request.ctx.principal.key
    if key is not None and key.templates is not None:
        earlier = await runs.get_run(request.app.ctx.core, trace_id=trace_id, **_who(request))
        if not key.allows_template(earlier.template_id):
            raise PermissionDeniedError("This API key may not start runs of that template.")
    run = await runs.retry_run(
        request.app.ctx.core, trace_id=trace_id, from_step=body.from_step, **_who(request)
    )
    return json({"message": SUCCESS, "trace_id": run.trace_id, "status": RunStatus.QUEUED,
                 "retry_of": trace_id}, status=202)


@bp.post("/run/<trace_id:str>/budget")
@documented(
    "Raise the budget that stopped a run (its own, or that of a run above it); it goes on "
    "from where it stopped",
    body=BudgetBody, response=out.BudgetRaised,
    errors={409: "ConflictError: neither the run nor a run below it is waiting for budget (waiting_budget).",
            422: "ValidationError: add_usd is not a positive number or decimal string."},
    links={"Read": Link("workflow.get_run", {"trace_id": "$response.body#/trace_id"})},
)
@protected(Role.USER)
async def raise_budget(request: Request, trace_id: str):
    body = parse_body(request, BudgetBody)
    core = request.app.ctx.core
    run = await runs.get_run(core, trace_id=trace_id, action=Action.RUN, **_who(request))
    run, raised = await spend_service.top_up(core, run, body.add_usd)
    return json({"message": SUCCESS, "trace_id": run.trace_id, "status": run.status,
                 "cost_usd": spend_service.money_fields(run)["cost_usd"],
                 "budget_usd": spend_service.money_fields(raised)["budget_usd"],
                 "budget_trace_id": raised.trace_id})


@bp.post("/cancel/<trace_id:str>")
@documented(
    "Cancel a run", response=out.Cancelled,
    errors={409: "ConflictError: the run has already ended."},
    links={"Read": Link("workflow.get_run", {"trace_id": "$response.body#/trace_id"})},
)
@protected(Role.USER, scope="run:cancel")
async def cancel_run(request: Request, trace_id: str):
    run = await runs.cancel_run(request.app.ctx.core, trace_id=trace_id, **_who(request))
    return json({"message": SUCCESS, "trace_id": run.trace_id, "status": run.status})


@bp.post("/reply/<trace_id:str>")
@documented(
    "Answer the question a waiting run asked", body=ReplyBody, response=out.Replied,
    errors={409: "ConflictError: the run waits for no reply, or request_id is not open.",
            413: "PayloadTooLargeError: the body is over its limit, or `content` is larger than a "
                 "step's output may be (ORCHESTRA_STEP_OUTPUT_MAX_BYTES); the question stays open."},
    links={"Read": Link("workflow.get_run", {"trace_id": "$response.body#/trace_id"})},
)
@protected(Role.USER, scope="run:reply")
async def reply(request: Request, trace_id: str):
    body = parse_body(request, ReplyBody)
    answered = await runs.reply(
        request.app.ctx.core,
        trace_id=trace_id,
        content=body.content,
        request_id=body.request_id,
        **_who(request),
    )
    return json({"message": SUCCESS, "trace_id": trace_id, **answered})


# --- the event stream ---------------------------------------------------------------


@bp.get("/sse/<trace_id:str>")
@documented(
    "Follow a run's events (Server-Sent Events)",
    description=stream_description(),
    response_content={"text/event-stream": {"schema": event_schema()}},
    extra_responses={204: "Last-Event-ID is already the terminal event: nothing more will come."},
    errors={422: "ValidationError: Last-Event-ID is not a non-negative integer."},
    params=(
        header("Last-Event-ID", "Resume after this event seq (empty: from the start).", **_AFTER),
        query("last_event_id", "Resume after this seq, when the header cannot be set "
              "(leave it out to start from the beginning: an empty value is a 422).", **_AFTER),
    ),
)
@protected(Role.USER, allow_query=True, scope="run:read")
async def stream(request: Request, trace_id: str):
    core = request.app.ctx.core
    after = min(parse_last_event_id(request), SEQ_MAX)
    run = await runs.open_stream(core, trace_id=trace_id, last_event_id=after, **_who(request))
    if run is None:
        return HTTPResponse(status=204, headers={"Cache-Control": "no-cache"})
    events = core.engine.follow(
        trace_id, after=after, ping_every=core.settings.sse_ping_seconds
    )
    await send_stream(request, trace_id, events, send_timeout=core.settings.sse_send_timeout,
                      max_seconds=core.settings.sse_max_seconds)
