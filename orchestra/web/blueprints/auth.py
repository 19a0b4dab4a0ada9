"""`/api/v1/auth`: the seed's six routes, exactly as specified."""

from __future__ import annotations

from typing import Literal

from sanic import Blueprint, Request
from sanic.response import HTTPResponse, json

from orchestra.services import auth as auth_service
from orchestra.services.roles import ROLE_NAMES, Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import rule, user_name_pattern
from orchestra.web.auth import protected
from orchestra.web.limits import rate_limited
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("auth", url_prefix="/auth")



class AuthBody(Body):
    """Auth bodies keep the seed's answers for text with a NUL: the auth service treats
    such a name or id as one that cannot exist (404), such a token as invalid (401)."""

    accepts_nul = True


_NAME_LOW, _NAME_HIGH = auth_service.USER_NAME_LENGTH
_PASSWORD_LOW, _PASSWORD_HIGH = auth_service.PASSWORD_LENGTH


class Credentials(AuthBody):
    user_name: str = rule(
        description=f"{_NAME_LOW}-{_NAME_HIGH} letters, digits, _ . - @ (NFKC, stripped); "
        "unique ignoring case.",
        pattern=user_name_pattern(_NAME_LOW, _NAME_HIGH),
    )
    password: str = rule(
        description=f"{_PASSWORD_LOW}-{_PASSWORD_HIGH} characters.",
        minLength=_PASSWORD_LOW,
        maxLength=_PASSWORD_HIGH,
    )


class RefreshBody(AuthBody):
    refresh_token: str


class AuthorityBody(AuthBody):
    user_id: str
    new_authority: Literal[tuple(ROLE_NAMES)]  # type: ignore[valid-type]


@bp.post("/register")
@documented(
    "Register a USER", body=Credentials, response=out.Registered, status=201,
    errors={409: "UserAlreadyExistsError: the name is taken (ignoring case)."},
)
@rate_limited("register")
async def register(request: Request):
    body = parse_body(request, Credentials)
    user = await auth_service.register(
        request.app.ctx.core, user_name=body.user_name, password=body.password
    )
    return json({"message": SUCCESS, "user_id": user.id}, status=201)


@bp.post("/login")
@documented(
    "Log in: an access and a refresh token", body=Credentials, response=out.LoggedIn,
    errors={401: "InvalidCredentialsError: wrong password.", 404: "UserNotExistError: no such user."},
    links={"Refresh": Link("auth.refresh", request_body={"refresh_token": "$response.body#/refresh_token"})},
)
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
@documented(
    "Exchange a refresh token for a new pair (single use)", body=RefreshBody, response=out.TokenPair,
    errors={401: "TokenInvalidError (bad, revoked, reused) or TokenExpiredError."},
)
async def refresh(request: Request):
    body = parse_body(request, RefreshBody)
    pair = await auth_service.refresh(request.app.ctx.core, refresh_token=body.refresh_token)
    return json(
        {"message": SUCCESS, "access_token": pair.access_token, "refresh_token": pair.refresh_token}
    )


@bp.put("/authority")
@documented(
    "Change a user's role", body=AuthorityBody, response=out.AuthorityChanged,
    errors={
        404: "UserNotExistError: unknown user_id.",
        409: "LastSuperAdministratorError: demoting the only super administrator.",
    },
)
@protected(Role.SUPER_ADMINISTRATOR)
async def authority(request: Request):
    body = parse_body(request, AuthorityBody)
    user = await auth_service.set_role(
        request.app.ctx.core, user_id=body.user_id, new_role=Role(body.new_authority)
    )
    return json({"message": SUCCESS, "user_id": user.id, "new_authority": user.role})


@bp.get("/list")
@documented("List the users, oldest first", response=out.UserList)
@protected(Role.SUPER_ADMINISTRATOR)
async def list_users(request: Request):
    # The copy the role check just confirmed against: one store-version probe a request.
    users = await auth_service.list_users(request.app.ctx.core, confirmed=request.ctx.users_copy)
    return HTTPResponse(_users_body(users), content_type="application/json")


_rendered: tuple[list, bytes] = ([], b"")


def _users_body(users: list) -> bytes:
    """The /list body. On SQLite the service hands out the same User objects until the
    store changes, so the JSON is rendered once per change, not once per request."""
    global _rendered
    last, body = _rendered
    if not body or len(last) != len(users) or any(a is not b for a, b in zip(last, users, strict=True)):
        rows = [{"user_id": u.id, "user_name": u.user_name, "role": u.role} for u in users]
        body = json({"message": SUCCESS, "users": rows}).body
        _rendered = (users, body)
    return body


@bp.delete("/<user_id:str>")
@documented(
    "Delete a user and everything the user owns", response=out.Done,
    errors={
        404: "UserNotExistError: unknown user_id.",
        409: "LastSuperAdministratorError: deleting the only super administrator.",
    },
)
@protected(Role.SUPER_ADMINISTRATOR)
async def delete_user(request: Request, user_id: str):
    await auth_service.delete_user(request.app.ctx.core, user_id=user_id)
    return json({"message": SUCCESS})
