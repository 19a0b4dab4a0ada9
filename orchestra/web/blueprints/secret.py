"""`/api/v1/resource/secret`: secrets for HTTP steps (SPEC §14, §15b). ADMINISTRATOR and
above manage and list the instance-wide ones; a workspace's admins manage and list its
own (`workspace_id` in the body, `?workspace_id=` on the other routes; SPEC §16). No
route ever returns a value (a list shows names, `…abcd` and the hosts each may be sent to)."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra import secret_hosts
from orchestra.services import secrets as secret_service
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented, query
from orchestra.web.apidoc.rules import ID_PATTERN, id_rule, rule
from orchestra.web.apidoc.workspace_shapes import BLANK_WORKSPACE, NOT_A_MEMBER
from orchestra.web.auth import protected
from orchestra.web.paging import workspace_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("secret", url_prefix="/resource/secret")

_VALUE = dict(
    description=f"The secret; {secret_service.VALUE_RULE}. Encrypted at rest, never returned.",
    pattern=secret_service.VALUE.pattern,
)


_HOSTS = dict(
    description=(
        "Where HTTP steps may send the secret: host names (api.example.com), wildcards "
        "(*.example.com: any name below example.com, not example.com itself), IPv4 or [IPv6] "
        "addresses, each with an optional :port (none: any port). Compared with the host as "
        "written in the step's URL (localhost and 127.0.0.1 are different hosts), at every "
        "connection, redirects included. Repeats are kept once."),
    minItems=1, maxItems=secret_hosts.HOSTS_MAX,
    items={"type": "string", "maxLength": secret_hosts.ENTRY_MAX, "pattern": secret_hosts.ENTRY_PATTERN},
)


class SecretBody(Body):
    name: str = rule(description="Used in templates as {{ secrets.NAME }}: "
                     f"{secret_service.NAME_RULE}.", pattern=secret_service.NAME.pattern)
    value: str = rule(**_VALUE)
    hosts: list[str] = rule(**_HOSTS)
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need admin there; "
                                       "404 when you are not a member); default: instance-wide (ADMINISTRATOR+).")


_WORKSPACE = query("workspace_id", "The workspace's secrets (you need admin there; 404 when you are not a "
                   "member); default: the instance-wide ones (ADMINISTRATOR+).", type="string", pattern=ID_PATTERN)
_ERRORS = {403: "PermissionDeniedError: instance-wide secrets need ADMINISTRATOR+, a workspace's need admin there.",
           404: NOT_A_MEMBER}
_QUERY_ERRORS = {**_ERRORS, 422: BLANK_WORKSPACE}  # ?workspace_id=


class SecretChangeBody(ClosedBody):
    """A new value, new hosts, or both (a secret stored before hosts existed is usable
    once its hosts are set)."""

    model_config = ClosedBody.model_config | {"json_schema_extra": {"minProperties": 1}}

    value: str = rule(None, **_VALUE)
    hosts: list[str] = rule(None, **_HOSTS)


def _answer(secret, status: int = 200):
    return json({"message": SUCCESS, **secret_service.secret_view(secret)}, status=status)


@bp.post("", strict_slashes=False)
@documented(
    "Store a secret", body=SecretBody, response=out.Secret, status=201,
    errors={409: "ConflictError: a secret of that workspace (or an instance-wide one) has this name.", **_ERRORS},
    links={
        "Replace": Link("secret.replace", {"name": "$response.body#/name"}),
        "Delete": Link("secret.delete", {"name": "$response.body#/name"}),
    },
)
@protected(Role.USER)
async def create(request: Request):
    core, principal = request.app.ctx.core, request.ctx.principal
    raw = request.json if isinstance(request.json, dict) else {}
    if raw.get("workspace_id") is None:  # instance-wide: the role first, as before workspaces
        await secret_service.scope_of(core, principal, None)
    body = parse_body(request, SecretBody)
    workspace_id = await secret_service.scope_of(core, principal, body.workspace_id)
    secret = await secret_service.create_secret(
        core, name=body.name, value=body.value, hosts=list(body.hosts),
        created_by=principal.user_id, workspace_id=workspace_id)
    return _answer(secret, 201)


async def _scope(request: Request) -> str | None:
    return await secret_service.scope_of(request.app.ctx.core, request.ctx.principal, workspace_arg(request))


@bp.get("", strict_slashes=False)
@documented("List the secrets by name (names and hints, never values): a workspace's, or the "
            "instance-wide ones", response=out.SecretList, params=(_WORKSPACE,), errors=_QUERY_ERRORS)
@protected(Role.USER)
async def list_all(request: Request):
    rows = await secret_service.list_secrets(request.app.ctx.core, await _scope(request))
    return json({"message": SUCCESS, "secrets": [secret_service.secret_view(s) for s in rows]})


@bp.put("/<name:str>")
@documented("Replace a secret's value, its hosts, or both", body=SecretChangeBody, response=out.Secret,
            params=(_WORKSPACE,), errors=_QUERY_ERRORS)
@protected(Role.USER)
async def replace(request: Request, name: str):
    workspace_id = await _scope(request)
    body = parse_body(request, SecretChangeBody)
    return _answer(await secret_service.update_secret(
        request.app.ctx.core, name=name, value=body.value,
        hosts=None if body.hosts is None else list(body.hosts), workspace_id=workspace_id))


@bp.delete("/<name:str>")
@documented("Delete a secret (a template naming it fails that step when it runs)", response=out.Done,
            params=(_WORKSPACE,), errors=_QUERY_ERRORS)
@protected(Role.USER)
async def delete(request: Request, name: str):
    workspace_id = await _scope(request)
    await secret_service.delete_secret(request.app.ctx.core, name=name, workspace_id=workspace_id)
    return json({"message": SUCCESS})
