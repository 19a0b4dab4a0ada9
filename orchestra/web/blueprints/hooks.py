"""`/api/v1/workflow/hook`: a person's inbound webhooks (SPEC §11), or a
team workspace's, by role (SPEC §16). Only people manage
hooks: an API key is refused (403), as on every route that names no key scope."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.language.expressions import MAX_LENGTH
from orchestra.services import hooks as service
from orchestra.services.roles import Role
from orchestra.web.apidoc import trigger_models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import ID_PATTERN, id_rule, rule
from orchestra.web.apidoc.workspace_shapes import BLANK_WORKSPACE, NOT_A_MEMBER, WORKSPACE_FILTER
from orchestra.web.auth import protected
from orchestra.web.paging import workspace_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("hooks", url_prefix="/workflow/hook")
INTAKE_PATH = "/api/v1/hooks/"


class HookBody(Body):
    template_id: str = rule(description="A template you may run (yours or shared).", pattern=ID_PATTERN)
    input: str = rule(
        service.DEFAULT_INPUT,
        description="CEL over `body` (JSON when the call is JSON, else its text), `headers` "
        "(lower-case names) and `query` (first values): the run's input. Default `body`.",
        minLength=1, maxLength=MAX_LENGTH,
    )
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need editor "
                                       "there; 404 when you are not a member); default: your personal "
                                       "one. Its template must be of the same workspace (or shared).")




def hook_url(request: Request, hook_id: str) -> str:
    """Where senders call the hook, as this request reached the server."""
    return f"{request.scheme}://{request.host}{INTAKE_PATH}{hook_id}"


_HOOK = {"hook_id": "$response.body#/hook_id"}


@bp.post("", strict_slashes=False)
@documented(
    "Create an inbound webhook (its signing secret is shown this once)", body=HookBody,
    response=out.HookCreated, status=201,
    description="Calls to `url` signed per Standard Webhooks with `secret` start runs of the "
    "template as you; see POST /api/v1/hooks/{hook_id}.",
    errors={403: "PermissionDeniedError: your role in workspace_id is below editor.",
            404: NOT_A_MEMBER,
            422: "ValidationError: a template you may not run or of another workspace (template_id), "
                 "or an input expression that does not compile or names other variables (input)."},
    links={"Read": Link("hooks.get_hook", _HOOK), "Delete": Link("hooks.delete_hook", _HOOK)},
)
@protected(Role.USER)
async def create_hook(request: Request):
    body = parse_body(request, HookBody)
    hook, secret = await service.create_hook(
        request.app.ctx.core, owner_id=request.ctx.principal.user_id,
        template_id=body.template_id, input=body.input, workspace_id=body.workspace_id)
    url = hook_url(request, hook.id)
    return json({"message": SUCCESS, "hook_id": hook.id, "url": url, "secret": secret,
                 "hook": service.hook_view(hook, url)}, status=201)


@bp.get("", strict_slashes=False)
@documented("List your inbound webhooks and your workspaces', oldest first", response=out.HookList,
            params=(WORKSPACE_FILTER,), errors={404: NOT_A_MEMBER, 422: BLANK_WORKSPACE})
@protected(Role.USER)
async def list_hooks(request: Request):
    hooks = await service.list_hooks(request.app.ctx.core, owner_id=request.ctx.principal.user_id,
                                     workspace_id=workspace_arg(request))
    return json({"message": SUCCESS,
                 "hooks": [service.hook_view(h, hook_url(request, h.id)) for h in hooks]})


@bp.get("/<hook_id:str>")
@documented("Read an inbound webhook (never its secret)", response=out.Hook)
@protected(Role.USER)
async def get_hook(request: Request, hook_id: str):
    hook = await service.get_hook(request.app.ctx.core, owner_id=request.ctx.principal.user_id,
                                  hook_id=hook_id)
    return json({"message": SUCCESS, "hook_id": hook.id,
                 "hook": service.hook_view(hook, hook_url(request, hook.id))})


@bp.delete("/<hook_id:str>")
@documented("Delete an inbound webhook (its URL answers 404 from then on)", response=out.HookDeleted,
            errors={403: "PermissionDeniedError: your role in the hook's workspace is below editor."})
@protected(Role.USER)
async def delete_hook(request: Request, hook_id: str):
    await service.delete_hook(request.app.ctx.core, owner_id=request.ctx.principal.user_id,
                              hook_id=hook_id)
    return json({"message": SUCCESS, "hook_id": hook_id})
