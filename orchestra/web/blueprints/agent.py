"""`/api/v1/agent`: the caller's workers, the built-in system nodes, and the cache reload."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.engine.tools import default_registry
from orchestra.services import agents
from orchestra.services.providers import NAME_MAX
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import (
    display_name,
    id_rule,
    model_rule,
    name_rule,
    rule,
    text_rule,
)
from orchestra.web.apidoc.workspace_shapes import NOT_A_MEMBER, WORKSPACE_FILTER
from orchestra.web.auth import protected
from orchestra.web.paging import PAGE_ERRORS, page_args, page_body, page_params, workspace_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("agent", url_prefix="/agent")



def _tools(default):
    return rule(
        default,
        description="Names from GET /resource/tool (duplicates dropped).",
        items={"anyOf": [
            {"enum": default_registry().names()},  # the built-in tools
            {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,64}\.[^\u0000]*$",
             "description": "A tool of an MCP server: <server name>.<tool name>."},
        ]},
    )


def _bound_skill():
    return rule(None, description="A skill name (ignoring case), or null.", **display_name(NAME_MAX))


class WorkerBody(Body):
    """A worker; provider_id, tools and bound_skill must name existing ones (else 422)."""

    name: str = name_rule()
    description: str = text_rule("")
    system_prompt: str = text_rule("", long=True)
    provider_id: str = id_rule(description="The id of a provider.")
    model: str | None = model_rule(None)
    tools: list[str] = _tools([])
    bound_skill: str | None = _bound_skill()
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need editor "
                                       "there; 404 when you are not a member); default: your personal one.")


_BELOW = "PermissionDeniedError: your role in the worker's workspace is below editor (`detail.role_needed`)."


class WorkerUpdateBody(ClosedBody):
    """Only the fields sent change; null clears model and bound_skill, and is refused
    for the others."""

    name: str = name_rule(None)
    description: str = text_rule(None)
    system_prompt: str = text_rule(None, long=True)
    provider_id: str = id_rule(None, description="The id of a provider.")
    model: str | None = model_rule(None)
    tools: list[str] = _tools(None)
    bound_skill: str | None = _bound_skill()


class NodeBody(ClosedBody):
    """Only provider (a provider id) and model; tools are fixed. At least one of them."""

    model_config = ClosedBody.model_config | {"json_schema_extra": {"minProperties": 1}}

    provider: str | None = id_rule(None, description="A provider id; null clears it.")
    model: str | None = model_rule(None)


_NODE_NAME = {"name": {"type": "string", "enum": list(agents.NODE_SPECS)}}


def _changes(body) -> dict:
    return {k: getattr(body, k) for k in body.model_fields_set}


@bp.post("/worker")
@documented(
    "Create one of your workers", body=WorkerBody, response=out.Worker, status=201,
    errors={403: _BELOW, 404: NOT_A_MEMBER,
            409: "ConflictError: you have a worker of that name (ignoring case and width)."},
    links={
        "Read": Link("agent.read_worker", {"worker_id": "$response.body#/worker_id"}),
        "Update": Link("agent.update_worker", {"worker_id": "$response.body#/worker_id"}),
        "Delete": Link("agent.delete_worker", {"worker_id": "$response.body#/worker_id"}),
        "UseInTemplate": Link("workflow.create_template", request_body={
            "name": "uses a worker",
            "steps": [{"id": "work", "agent": {"worker": "$response.body#/worker_id"}, "prompt": "{{input}}"}],
        }),
    },
)
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
@documented(
    "List your workers and your workspaces', oldest first (paged)", response=out.WorkerList,
    errors={404: NOT_A_MEMBER, 422: PAGE_ERRORS}, params=(*page_params("workers"), WORKSPACE_FILTER),
)
@protected(Role.USER)
async def list_workers(request: Request):
    core = request.app.ctx.core
    limit, cursor = page_args(request)
    page = await agents.list_workers(
        core, owner_id=request.ctx.principal.user_id, limit=limit, cursor=cursor,
        workspace_id=workspace_arg(request),
    )
    return json(page_body("workers", await agents.worker_views(core, page.rows), page))


@bp.get("/worker/<worker_id:str>")
@documented("Read one of your workers", response=out.Worker)
@protected(Role.USER)
async def read_worker(request: Request, worker_id: str):
    core = request.app.ctx.core
    worker = await agents.get_worker(
        core, owner_id=request.ctx.principal.user_id, worker_id=worker_id
    )
    (view,) = await agents.worker_views(core, [worker])
    return json({"message": SUCCESS, **view})


@bp.put("/worker/<worker_id:str>")
@documented(
    "Change one of your workers (only the fields sent)", body=WorkerUpdateBody, response=out.Worker,
    errors={403: _BELOW, 409: "ConflictError: you have another worker of that name (ignoring case and width)."},
)
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
@documented("Delete one of your workers", response=out.Done, errors={403: _BELOW})
@protected(Role.USER)
async def delete_worker(request: Request, worker_id: str):
    await agents.delete_worker(
        request.app.ctx.core, owner_id=request.ctx.principal.user_id, worker_id=worker_id
    )
    return json({"message": SUCCESS})


@bp.get("/node")
@documented("List the system nodes", response=out.NodeList)
@protected(Role.USER)
async def list_nodes(request: Request):
    return json({"message": SUCCESS, "nodes": await agents.list_nodes(request.app.ctx.core)})


@bp.get("/node/<name:str>")
@documented("Read a system node", response=out.Node, path=_NODE_NAME)
@protected(Role.USER)
async def read_node(request: Request, name: str):
    return json({"message": SUCCESS, **await agents.get_node(request.app.ctx.core, name)})


@bp.put("/node/<name:str>")
@documented(
    "Set a system node's provider and/or model", body=NodeBody, response=out.Node, path=_NODE_NAME
)
@protected(Role.ADMINISTRATOR)
async def update_node(request: Request, name: str):
    body = parse_body(request, NodeBody)
    node = await agents.update_node(request.app.ctx.core, name=name, **_changes(body))
    return json({"message": SUCCESS, **node})


@bp.post("/reload")
@documented("Drop the cached worker and node state and read it again", response=out.Reloaded)
@protected(Role.ADMINISTRATOR)
async def reload(request: Request):
    counts = await request.app.ctx.core.agent_cache.reload_everywhere()
    return json({"message": SUCCESS, **counts})
