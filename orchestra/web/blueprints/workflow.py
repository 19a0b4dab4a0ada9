"""`/api/v1/workflow`: templates, runs, cancel, reply and the SSE event stream."""

from __future__ import annotations

from typing import Any

from sanic import Blueprint, Request
from sanic.response import HTTPResponse, json
from sanic_ext import openapi

from orchestra.errors import ValidationError
from orchestra.services import workflows as service
from orchestra.services.workflows import engine_of
from orchestra.services.roles import Role
from orchestra.web.auth import protected
from orchestra.web.responses import SUCCESS
from orchestra.web.sse import parse_last_event_id, send_stream
from orchestra.web.validation import Body, parse_body

bp = Blueprint("workflow", url_prefix="/workflow")



class TemplateBody(Body):
    name: str
    description: str = ""
    steps: list[Any]
    shared: bool | None = None


class RunBody(Body):
    template_id: str
    input: str = ""
    files: list[str] | None = None


class ReplyBody(Body):
    content: str
    request_id: str | None = None


def _who(request: Request) -> dict[str, Any]:
    principal = request.ctx.principal
    return {"user_id": principal.user_id, "is_admin": principal.is_admin}


def _flag(request: Request, name: str) -> bool:
    return (request.args.get(name) or "").strip().lower() in {"1", "true", "yes", "on"}


# --- templates ------------------------------------------------------------------------


@bp.post("/template")
@openapi.body({"application/json": TemplateBody}, required=True)
@openapi.response(201, description="message, template_id, template.")
@openapi.secured("bearer")
@protected(Role.USER)
async def create_template(request: Request):
    body = parse_body(request, TemplateBody)
    principal = request.ctx.principal
    template = await service.create_template(
        request.app.ctx.core,
        owner_id=principal.user_id,
        is_admin=principal.is_admin,
        name=body.name,
        description=body.description,
        steps=body.steps,
        shared=bool(body.shared),
    )
    view = service.template_view(template)
    return json({"message": SUCCESS, "template_id": template.id, "template": view}, status=201)


@bp.get("/template")
@openapi.response(200, description="message, templates (own and shared).")
@openapi.secured("bearer")
@protected(Role.USER)
async def list_templates(request: Request):
    rows = await service.list_templates(request.app.ctx.core, user_id=request.ctx.principal.user_id)
    return json({"message": SUCCESS, "templates": [service.template_view(t) for t in rows]})


@bp.get("/template/<template_id:str>")
@openapi.secured("bearer")
@protected(Role.USER)
async def get_template(request: Request, template_id: str):
    template = await service.get_template(
        request.app.ctx.core, template_id=template_id, **_who(request)
    )
    return json(
        {"message": SUCCESS, "template_id": template.id, "template": service.template_view(template)}
    )


@bp.put("/template/<template_id:str>")
@openapi.body({"application/json": TemplateBody}, required=True)
@openapi.secured("bearer")
@protected(Role.USER)
async def update_template(request: Request, template_id: str):
    body = parse_body(request, TemplateBody)
    template = await service.update_template(
        request.app.ctx.core,
        template_id=template_id,
        name=body.name,
        description=body.description,
        steps=body.steps,
        shared=body.shared,
        **_who(request),
    )
    return json(
        {"message": SUCCESS, "template_id": template.id, "template": service.template_view(template)}
    )


@bp.delete("/template/<template_id:str>")
@openapi.secured("bearer")
@protected(Role.USER)
async def delete_template(request: Request, template_id: str):
    await service.delete_template(request.app.ctx.core, template_id=template_id, **_who(request))
    return json({"message": SUCCESS, "template_id": template_id})


# --- runs -----------------------------------------------------------------------------


@bp.post("/run")
@openapi.body({"application/json": RunBody}, required=True)
@openapi.response(202, description="message, trace_id, status (queued).")
@openapi.secured("bearer")
@protected(Role.USER)
async def start_run(request: Request):
    body = parse_body(request, RunBody)
    run = await service.start_run(
        request.app.ctx.core,
        template_id=body.template_id,
        input=body.input,
        files=body.files,
        **_who(request),
    )
    return json({"message": SUCCESS, "trace_id": run.trace_id, "status": "queued"}, status=202)


@bp.get("/run")
@openapi.response(200, description="message, runs (newest first); ?all=1 for administrators.")
@openapi.secured("bearer")
@protected(Role.USER)
async def list_runs(request: Request):
    raw_limit = request.args.get("limit") or "100"
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
        raise ValidationError.field("limit", "must be an integer from 1 to 1000")
    runs = await service.list_runs(
        request.app.ctx.core, all_users=_flag(request, "all"), limit=int(raw_limit), **_who(request)
    )
    return json({"message": SUCCESS, "runs": [service.run_summary(r) for r in runs]})


@bp.get("/run/<trace_id:str>")
@openapi.response(200, description="message, the run's fields (also under `run`), steps.")
@openapi.secured("bearer")
@protected(Role.USER)
async def get_run(request: Request, trace_id: str):
    core = request.app.ctx.core
    run = await service.get_run(core, trace_id=trace_id, **_who(request))
    detail = await service.run_detail(core, run)
    return json({"message": SUCCESS, **detail, "run": detail})


@bp.get("/run/<trace_id:str>/events")
@openapi.response(200, description="message, events [{seq, kind, data}] after ?after=.")
@openapi.secured("bearer")
@protected(Role.USER)
async def list_events(request: Request, trace_id: str):
    raw = (request.args.get("after") or "0").strip()
    if not raw.isdigit() or len(raw) > 18:
        raise ValidationError.field("after", "must be a non-negative integer")
    events = await service.list_events(
        request.app.ctx.core, trace_id=trace_id, after=int(raw), **_who(request)
    )
    return json({"message": SUCCESS, "events": [e.as_dict() for e in events]})


@bp.post("/cancel/<trace_id:str>")
@openapi.response(200, description="message, trace_id, status.")
@openapi.secured("bearer")
@protected(Role.USER)
async def cancel_run(request: Request, trace_id: str):
    run = await service.cancel_run(request.app.ctx.core, trace_id=trace_id, **_who(request))
    return json({"message": SUCCESS, "trace_id": run.trace_id, "status": run.status})


@bp.post("/reply/<trace_id:str>")
@openapi.body({"application/json": ReplyBody}, required=True)
@openapi.response(200, description="message, trace_id, request_id, step_id.")
@openapi.secured("bearer")
@protected(Role.USER)
async def reply(request: Request, trace_id: str):
    body = parse_body(request, ReplyBody)
    answered = await service.reply(
        request.app.ctx.core,
        trace_id=trace_id,
        content=body.content,
        request_id=body.request_id,
        **_who(request),
    )
    return json({"message": SUCCESS, "trace_id": trace_id, **answered})


# --- the event stream ---------------------------------------------------------------


@bp.get("/sse/<trace_id:str>")
@openapi.response(200, description="text/event-stream of the run's events.")
@openapi.response(204, description="Last-Event-ID is already the terminal event.")
@openapi.secured("bearer")
@protected(Role.USER, allow_query=True)
async def stream(request: Request, trace_id: str):
    core = request.app.ctx.core
    after = parse_last_event_id(request)
    run = await service.open_stream(core, trace_id=trace_id, last_event_id=after, **_who(request))
    if run is None:
        return HTTPResponse(status=204, headers={"Cache-Control": "no-cache"})
    events = engine_of(core).feeds.follow(
        trace_id, after=after, ping_every=core.settings.sse_ping_seconds
    )
    await send_stream(request, trace_id, events, send_timeout=core.settings.sse_send_timeout)
