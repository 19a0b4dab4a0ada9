"""`/api/v1/resource/secret`: secrets for HTTP steps (SPEC §14, §15b). ADMINISTRATOR and
above manage and list them; no route ever returns a value (a list shows names, `…abcd`
and the hosts each may be sent to)."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra import secret_hosts
from orchestra.services import secrets as secret_service
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import rule
from orchestra.web.auth import protected
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
    errors={409: "ConflictError: a secret has this name."},
    links={
        "Replace": Link("secret.replace", {"name": "$response.body#/name"}),
        "Delete": Link("secret.delete", {"name": "$response.body#/name"}),
    },
)
@protected(Role.ADMINISTRATOR)
async def create(request: Request):
    body = parse_body(request, SecretBody)
    secret = await secret_service.create_secret(
        request.app.ctx.core, name=body.name, value=body.value, hosts=list(body.hosts),
        created_by=request.ctx.principal.user_id)
    return _answer(secret, 201)


@bp.get("", strict_slashes=False)
@documented("List the secrets by name (names and hints, never values)", response=out.SecretList)
@protected(Role.ADMINISTRATOR)
async def list_all(request: Request):
    rows = await secret_service.list_secrets(request.app.ctx.core)
    return json({"message": SUCCESS, "secrets": [secret_service.secret_view(s) for s in rows]})


@bp.put("/<name:str>")
@documented("Replace a secret's value, its hosts, or both", body=SecretChangeBody, response=out.Secret)
@protected(Role.ADMINISTRATOR)
async def replace(request: Request, name: str):
    body = parse_body(request, SecretChangeBody)
    return _answer(await secret_service.update_secret(
        request.app.ctx.core, name=name, value=body.value,
        hosts=None if body.hosts is None else list(body.hosts)))


@bp.delete("/<name:str>")
@documented("Delete a secret (a template naming it fails that step when it runs)", response=out.Done)
@protected(Role.ADMINISTRATOR)
async def delete(request: Request, name: str):
    await secret_service.delete_secret(request.app.ctx.core, name=name)
    return json({"message": SUCCESS})
