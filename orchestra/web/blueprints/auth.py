"""`/api/v1/auth`: the seed's six routes, exactly as specified."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from sanic import Blueprint, Request
from sanic.response import HTTPResponse, json
from sanic_ext import openapi
from sanic_ext.extensions.openapi.definitions import Component

from orchestra.services import auth as auth_service
from orchestra.services.roles import Role
from orchestra.web.auth import protected
from orchestra.web.limits import rate_limited
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("auth", url_prefix="/auth")



@openapi.component
class AuthBody(Body):
    """Auth bodies keep the seed's answers for text with a NUL: the auth service treats
    such a name or id as one that cannot exist (404), such a token as invalid (401)."""

    accepts_nul = True


class Credentials(AuthBody):
    user_name: str = Field(
        description="3-64 letters, digits, _ . - @ (NFKC, stripped); unique ignoring case."
    )
    password: str = Field(description="8-256 characters.")


@openapi.component
class RefreshBody(AuthBody):
    refresh_token: str


@openapi.component
class AuthorityBody(AuthBody):
    user_id: str
    new_authority: Literal["SUPER_ADMINISTRATOR", "ADMINISTRATOR", "USER"]


@bp.post("/register")
@openapi.body({"application/json": Component(Credentials)}, required=True)
@openapi.response(201, description="The user was created; body: message, user_id.")
@rate_limited("register")
async def register(request: Request):
    body = parse_body(request, Credentials)
    user = await auth_service.register(
        request.app.ctx.core, user_name=body.user_name, password=body.password
    )
    return json({"message": SUCCESS, "user_id": user.id}, status=201)


@bp.post("/login")
@openapi.body({"application/json": Component(Credentials)}, required=True)
@openapi.response(200, description="message, token (= access_token), access_token, refresh_token.")
@rate_limited("login")
async def login(request: Request):
    body = parse_body(request, Credentials)
    pair = await auth_service.login(
        request.app.ctx.core, user_name=body.user_name, password=body.password
    )
    return json(
        {
            "message": SUCCESS,
            "token": pair.access_token,
            "access_token": pair.access_token,
            "refresh_token": pair.refresh_token,
        }
    )


@bp.post("/refresh")
@openapi.body({"application/json": Component(RefreshBody)}, required=True)
@openapi.response(200, description="message, access_token, refresh_token (both new).")
async def refresh(request: Request):
    body = parse_body(request, RefreshBody)
    pair = await auth_service.refresh(request.app.ctx.core, refresh_token=body.refresh_token)
    return json(
        {"message": SUCCESS, "access_token": pair.access_token, "refresh_token": pair.refresh_token}
    )


@bp.put("/authority")
@openapi.body({"application/json": Component(AuthorityBody)}, required=True)
@openapi.response(200, description="message, user_id, new_authority.")
@openapi.secured("bearer")
@protected(Role.SUPER_ADMINISTRATOR)
async def authority(request: Request):
    body = parse_body(request, AuthorityBody)
    user = await auth_service.set_role(
        request.app.ctx.core, user_id=body.user_id, new_role=Role(body.new_authority)
    )
    return json({"message": SUCCESS, "user_id": user.id, "new_authority": user.role})


@bp.get("/list")
@openapi.response(200, description="message, users: [{user_id, user_name, role}], oldest first.")
@openapi.secured("bearer")
@protected(Role.SUPER_ADMINISTRATOR)
async def list_users(request: Request):
    users = await auth_service.list_users(request.app.ctx.core)
    return HTTPResponse(_users_body(users), content_type="application/json")


_rendered: tuple[list, bytes] = ([], b"")


def _users_body(users: list) -> bytes:
    """The /list body. On SQLite the service hands out the same User objects until the
    store changes, so the JSON is rendered once per change, not once per request."""
    global _rendered
    last, body = _rendered
    if not body or len(last) != len(users) or any(a is not b for a, b in zip(last, users)):
        rows = [{"user_id": u.id, "user_name": u.user_name, "role": u.role} for u in users]
        body = json({"message": SUCCESS, "users": rows}).body
        _rendered = (users, body)
    return body


@bp.delete("/<user_id:str>")
@openapi.response(200, description="message; the user and everything the user owns are deleted.")
@openapi.secured("bearer")
@protected(Role.SUPER_ADMINISTRATOR)
async def delete_user(request: Request, user_id: str):
    await auth_service.delete_user(request.app.ctx.core, user_id=user_id)
    return json({"message": SUCCESS})
