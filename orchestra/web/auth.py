"""Bearer-token authentication and role guards for handlers.

A bearer value is an access token (JWT) or an API key (`orc_…`, SPEC §11). A key acts
as its user with the user's current role, narrowed to its scopes: a route says which
scope it needs (`@protected(..., scope="run:read")`), and a route that names none
(auth administration, key management, providers, …) refuses every key with 403.

A key belongs to a workspace (SPEC §16), and this gate is where that is decided for every
route, stream and MCP call: it reads the user's role in the key's workspace now (401 once
the user is no longer a member there), refuses a scope the role does not cover (403 naming
the least role, `workspace_rights.SCOPE_ACTIONS`), and binds the key's workspace
(`workspace_rights.bind_key_reach`) so the services answer 404 for any other workspace."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import wraps

from sanic import Request

from orchestra.db.database import release_connection
from orchestra.errors import AuthenticationRequiredError, PermissionDeniedError, TokenInvalidError
from orchestra.services import api_keys, audit
from orchestra.services import auth as auth_service
from orchestra.services.api_keys import KeyGrant
from orchestra.services.roles import Role
from orchestra.services.tokens import ACCESS, FAMILY_CLAIM
from orchestra.services.workspace_rights import SCOPE_ACTIONS, allows, bind_key_reach, refusal


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's user, with the role in force for this request."""

    user_id: str
    name: str
    role: Role
    family: str | None = None  # the token's refresh family (`fam`); None on older tokens
    issued_at: float = 0.0  # the token's `iat`
    key: KeyGrant | None = None  # set when the caller sent an API key

    def at_least(self, role: Role) -> bool:
        return self.role.at_least(role)

    @property
    def is_admin(self) -> bool:
        return self.role.at_least(Role.ADMINISTRATOR)


def bind(principal: Principal) -> None:
    """The caller for what the request does next: the audit log's actor and, for a key,
    the one workspace it reaches (an MCP session's task binds again for each request)."""
    audit.bind_actor(actor_of(principal))
    bind_key_reach(principal.key.reach(principal.user_id) if principal.key is not None else None)


def actor_of(principal: Principal) -> audit.Actor:
    """The caller as the audit log names it (SPEC §16)."""
    if principal.key is not None:
        return audit.Actor(principal.user_id, principal.name, via="key", key_id=principal.key.key_id)
    return audit.Actor(principal.user_id, principal.name)


def bearer_token(request: Request, *, allow_query: bool = False) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise TokenInvalidError(
                "Use the 'Authorization: Bearer <access_token or API key>' header.")
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
    return Principal(user_id=claims["sub"], name=claims["name"], role=role,
                     family=claims.get(FAMILY_CLAIM), issued_at=claims["iat"])


def require_role(principal: Principal, minimum: Role) -> None:
    if not principal.at_least(minimum):
        raise PermissionDeniedError(f"This operation needs the role {minimum.value} or above.")


async def _key_principal(request: Request, token: str, minimum: Role, scope: str | None) -> Principal:
    """The caller of an API key: its user with the user's role as stored now, refused
    unless the key is still valid now, the route takes `scope` and the user's role in the
    key's workspace, read now, has the right that scope acts with."""
    core = request.app.ctx.core
    entry = await api_keys.authenticate(core, token)
    workspace = await api_keys.key_workspace(core, entry)  # the key, the user's roles: now
    try:
        role = Role(workspace.user_role)
    except ValueError:
        raise TokenInvalidError("The key's user has an unknown role.") from None
    if scope is None:
        raise PermissionDeniedError("API keys cannot be used here; sign in as a person.")
    if scope not in entry.scopes:
        raise PermissionDeniedError(f"This API key lacks the scope '{scope}'.")
    action = SCOPE_ACTIONS[scope]
    if not allows(workspace.role, action):
        raise refusal(workspace.role, action, workspace.name)
    principal = Principal(user_id=entry.user_id, name=entry.user_name, role=role,
                          key=api_keys.grant_of(entry, workspace))
    require_role(principal, minimum)
    return principal


def protected(minimum: Role = Role.USER, *, allow_query: bool = False, scope: str | None = None):
    """Decorator: authenticate, then authorise with the *lower* of the token's role and
    the role stored now. The caller is re-read from the store on every request, so a
    deleted user's token stops at once and a demotion takes effect at once on every
    route (a promotion waits for a new token); an access token whose refresh family was
    revoked stops at once too. Sets `request.ctx.principal`, whose role
    is that effective role, and `request.ctx.users_copy`, the in-process user copy the
    check was answered from (None when it read the store, or for an API key), and hands
    the pooled store connection back before the handler runs: a slow body or a slow
    handler must not hold one.

    `scope` is what an API key needs to call the route (SPEC §11); None refuses keys."""

    def decorator(handler):
        @wraps(handler)
        async def wrapper(request: Request, *args, **kwargs):
            core = request.app.ctx.core
            token = bearer_token(request, allow_query=allow_query)
            if token is not None and api_keys.is_api_key(token):
                principal = await _key_principal(request, token, minimum, scope)
                request.ctx.users_copy = None
            else:
                principal = authenticate(request, allow_query=allow_query)
                require_role(principal, minimum)
                user, request.ctx.users_copy = await auth_service.confirm_caller(
                    core, user_id=principal.user_id, minimum=minimum,
                    family=principal.family, issued_at=principal.issued_at,
                )
                stored = Role(user.role)
                if stored.rank < principal.role.rank:
                    principal = replace(principal, role=stored)
            if request.ctx.users_copy is None:
                # The check read the store (an API key's may have too). Answered from the
                # in-process copy, nothing in this request has touched the store yet
                # (there is no request middleware), so there is nothing to hand back.
                await release_connection(core.db)
            request.ctx.principal = principal
            bind(principal)
            return await handler(request, *args, **kwargs)

        wrapper.required_role = minimum  # read by the OpenAPI document (security, 401/403)
        wrapper.token_in_query = allow_query
        wrapper.key_scope = scope  # read by the OpenAPI document (which keys may call it)
        return wrapper

    return decorator
