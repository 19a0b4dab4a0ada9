"""`/api/v1/resource/secret`: secrets for HTTP steps (SPEC §14). ADMINISTRATOR and above
manage and list them; no route ever returns a value (a list shows names and `…abcd`)."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.services import secrets as secret_service
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import rule
from orchestra.web.auth import protected
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("secret", url_prefix="/resource/secret")

_VALUE = dict(
    description=f"The secret; {secret_service.VALUE_RULE}. Encrypted at rest, never returned.",
    pattern=secret_service.VALUE.pattern,
)


class SecretBody(Body):
    name: str = rule(description="Used in templates as {{ secrets.NAME }}: "
                     f"{secret_service.NAME_RULE}.", pattern=secret_service.NAME.pattern)
    value: str = rule(**_VALUE)


class SecretValueBody(Body):
    value: str = rule(**_VALUE)


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
        request.app.ctx.core, name=body.name, value=body.value, created_by=request.ctx.principal.user_id)
    return _answer(secret, 201)


@bp.get("", strict_slashes=False)
@documented("List the secrets by name (names and hints, never values)", response=out.SecretList)
@protected(Role.ADMINISTRATOR)
async def list_all(request: Request):
    rows = await secret_service.list_secrets(request.app.ctx.core)
    return json({"message": SUCCESS, "secrets": [secret_service.secret_view(s) for s in rows]})


@bp.put("/<name:str>")
@documented("Replace a secret's value", body=SecretValueBody, response=out.Secret)
@protected(Role.ADMINISTRATOR)
async def replace(request: Request, name: str):
    body = parse_body(request, SecretValueBody)
    return _answer(await secret_service.update_secret(request.app.ctx.core, name=name, value=body.value))


@bp.delete("/<name:str>")
@documented("Delete a secret (a template naming it fails that step when it runs)", response=out.Done)
@protected(Role.ADMINISTRATOR)
async def delete(request: Request, name: str):
    await secret_service.delete_secret(request.app.ctx.core, name=name)
    return json({"message": SUCCESS})
