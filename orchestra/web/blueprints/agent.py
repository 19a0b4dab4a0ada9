"""`/api/v1/agent`: the caller's workers, the built-in system nodes, and the cache reload."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json
from sanic_ext import openapi

from orchestra.services import agents
from orchestra.services.roles import Role
from orchestra.web.auth import protected
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("agent", url_prefix="/agent")



class WorkerBody(Body):
    name: str
    description: str = ""
    system_prompt: str = ""
    provider_id: str
    model: str | None = None
    tools: list[str] = []
    bound_skill: str | None = None


class WorkerUpdateBody(ClosedBody):
    """Only the fields sent change; null clears model and bound_skill, and is refused
    for the others."""

    name: str = None  # type: ignore[assignment]
    description: str = None  # type: ignore[assignment]
    system_prompt: str = None  # type: ignore[assignment]
    provider_id: str = None  # type: ignore[assignment]
    model: str | None = None
    tools: list[str] = None  # type: ignore[assignment]
    bound_skill: str | None = None


class NodeBody(ClosedBody):
    """Only provider (a provider id) and model; tools are fixed."""

    provider: str | None = None
    model: str | None = None


def _changes(body) -> dict:
    return {k: getattr(body, k) for k in body.model_fields_set}


@bp.post("/worker")
@openapi.body({"application/json": WorkerBody}, required=True)
@openapi.response(201, description="The worker.")
@openapi.secured("bearer")
@protected(Role.USER)
async def create_worker(request: Request):
    body = parse_body(request, WorkerBody)
    core = request.app.ctx.core
    worker = await agents.create_worker(
        core, owner_id=request.ctx.principal.user_id, **body.model_dump()
    )
    (view,) = await agents.worker_views(core, [worker])
    return json({"message": SUCCESS, **view}, status=201)


@bp.get("/worker")
@openapi.secured("bearer")
@protected(Role.USER)
async def list_workers(request: Request):
    core = request.app.ctx.core
    rows = await agents.list_workers(core, owner_id=request.ctx.principal.user_id)
    return json({"message": SUCCESS, "workers": await agents.worker_views(core, rows)})


@bp.get("/worker/<worker_id:str>")
@openapi.secured("bearer")
@protected(Role.USER)
async def read_worker(request: Request, worker_id: str):
    core = request.app.ctx.core
    worker = await agents.get_worker(
        core, owner_id=request.ctx.principal.user_id, worker_id=worker_id
    )
    (view,) = await agents.worker_views(core, [worker])
    return json({"message": SUCCESS, **view})


@bp.put("/worker/<worker_id:str>")
@openapi.body({"application/json": WorkerUpdateBody}, required=True)
@openapi.secured("bearer")
@protected(Role.USER)
async def update_worker(request: Request, worker_id: str):
    body = parse_body(request, WorkerUpdateBody)
    core = request.app.ctx.core
    worker = await agents.update_worker(
        core, owner_id=request.ctx.principal.user_id, worker_id=worker_id, **_changes(body)
    )
    (view,) = await agents.worker_views(core, [worker])
    return json({"message": SUCCESS, **view})


@bp.delete("/worker/<worker_id:str>")
@openapi.secured("bearer")
@protected(Role.USER)
async def delete_worker(request: Request, worker_id: str):
    await agents.delete_worker(
        request.app.ctx.core, owner_id=request.ctx.principal.user_id, worker_id=worker_id
    )
    return json({"message": SUCCESS})


@bp.get("/node")
@openapi.response(200, description="message, nodes: [{name, provider, model, tools, ...}].")
@openapi.secured("bearer")
@protected(Role.USER)
async def list_nodes(request: Request):
    return json({"message": SUCCESS, "nodes": await agents.list_nodes(request.app.ctx.core)})


@bp.get("/node/<name:str>")
@openapi.secured("bearer")
@protected(Role.USER)
async def read_node(request: Request, name: str):
    return json({"message": SUCCESS, **await agents.get_node(request.app.ctx.core, name)})


@bp.put("/node/<name:str>")
@openapi.body({"application/json": NodeBody}, required=True)
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def update_node(request: Request, name: str):
    body = parse_body(request, NodeBody)
    node = await agents.update_node(request.app.ctx.core, name=name, **_changes(body))
    return json({"message": SUCCESS, **node})


@bp.post("/reload")
@openapi.response(200, description="message, workers: n, nodes: n.")
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def reload(request: Request):
    counts = await agents.reload_everywhere(request.app.ctx.core)
    return json({"message": SUCCESS, **counts})
