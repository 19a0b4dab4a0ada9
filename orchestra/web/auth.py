"""Bearer-token authentication and role guards for handlers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

from sanic import Request

from orchestra.errors import AuthenticationRequiredError, PermissionDeniedError, TokenInvalidError
from orchestra.services import auth as auth_service
from orchestra.services.roles import Role
from orchestra.services.tokens import ACCESS


@dataclass(frozen=True)
class Principal:
    """Who is calling, as the access token says."""

    user_id: str
    name: str
    role: Role

    def at_least(self, role: Role) -> bool:
        return self.role.at_least(role)

    @property
    def is_admin(self) -> bool:
        return self.role.at_least(Role.ADMINISTRATOR)


def bearer_token(request: Request, *, allow_query: bool = False) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise TokenInvalidError("Use the 'Authorization: Bearer <access_token>' header.")
        return token.strip()
    if allow_query:
        return request.args.get("access_token") or None
    return None


def authenticate(request: Request, *, allow_query: bool = False) -> Principal:
    """The caller from a valid access token; 401 when it is missing or bad."""
    token = bearer_token(request, allow_query=allow_query)
    if token is None:
        raise AuthenticationRequiredError()
    claims = request.app.ctx.core.tokens.decode(token, expected_type=ACCESS)
    try:
        role = Role(claims["role"])
    except ValueError:
        raise TokenInvalidError("The token carries an unknown role.") from None
    return Principal(user_id=claims["sub"], name=claims["name"], role=role)


def require_role(principal: Principal, minimum: Role) -> None:
    if not principal.at_least(minimum):
        raise PermissionDeniedError(f"This operation needs the role {minimum.value} or above.")


def protected(minimum: Role = Role.USER, *, confirm: bool = False, allow_query: bool = False):
    """Decorator: authenticate and check the token's role. The caller is always re-read
    from the store, so a deleted user's token stops working at once everywhere; with
    confirm=True the role is re-checked there too, so a demoted one's does as well.
    Sets `request.ctx.principal`."""

    def decorator(handler):
        @wraps(handler)
        async def wrapper(request: Request, *args, **kwargs):
            principal = authenticate(request, allow_query=allow_query)
            require_role(principal, minimum)
            await auth_service.confirm_role(
                request.app.ctx.core,
                user_id=principal.user_id,
                minimum=minimum if confirm else Role.USER,
            )
            request.ctx.principal = principal
            return await handler(request, *args, **kwargs)

        wrapper.required_role = minimum  # read by the OpenAPI document (security, 401/403)
        wrapper.token_in_query = allow_query
        return wrapper

    return decorator
