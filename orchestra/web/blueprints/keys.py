"""`/api/v1/auth/key`: a person's API keys (SPEC §11). Keys themselves cannot call these
routes (403): a leaked key cannot mint more keys or hide its own revocation. A key is made
in a workspace (SPEC §16: `admin` there; by default the caller's personal one) and
reaches that workspace only."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.services import api_keys as service
from orchestra.services.roles import Role
from orchestra.web.apidoc import trigger_models as out
from orchestra.web.apidoc.operation import documented
from orchestra.web.apidoc.rules import ID_PATTERN, id_rule, rule, stripped
from orchestra.web.apidoc.workspace_shapes import BLANK_WORKSPACE, NOT_A_MEMBER, WORKSPACE_FILTER
from orchestra.web.auth import protected
from orchestra.web.paging import workspace_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("keys", url_prefix="/auth/key")


class KeyBody(Body):
    name: str = rule(description=f"1-{service.NAME_MAX} characters, to tell your keys apart.",
                     pattern=stripped(service.NAME_MAX))
    scopes: list[str] = rule(
        description="What the key may do, at most what its user may: " + ", ".join(service.SCOPES) + ".",
        minItems=1, maxItems=len(service.SCOPES) * 4,
        items={"type": "string", "enum": list(service.SCOPES)},
    )
    templates: list[str] | None = rule(
        None, description="Template ids run:start is limited to (each one you may run, of the "
        "key's workspace or shared); null or absent: any you may run there.", maxItems=service.TEMPLATES_MAX,
        items={"type": "string", "pattern": ID_PATTERN},
    )
    expires_at: str | None = rule(
        None, description="ISO 8601 date and time in the future (no offset: UTC); absent: never.",
        format="date-time",
    )
    workspace_id: str | None = id_rule(
        None, description="The one workspace the key reaches (you need admin there; 404 when you "
        "are not a member); default: your personal one.")


@bp.post("", strict_slashes=False)
@documented(
    "Create an API key (its secret is shown this once)", body=KeyBody, response=out.KeyCreated,
    status=201,
    description="Send the key as `Authorization: Bearer orc_…`: it acts as you, with your "
    "current role, narrowed to its scopes, in its workspace only (anything of another workspace "
    "is 404), never beyond your role there at the moment of use (403 naming the role needed; "
    "401 once you are no longer a member). Keys never reach the auth administration routes, "
    "key management or providers (403).",
    errors={403: "PermissionDeniedError: your role in workspace_id is below admin (detail.role_needed).",
            404: NOT_A_MEMBER,
            422: "ValidationError: unknown scopes, a template you may not run or of another "
                 "workspace (templates), an expiry not in the future."},
)
@protected(Role.USER)
async def create_key(request: Request):
    body = parse_body(request, KeyBody)
    key, secret = await service.create_key(
        request.app.ctx.core, user_id=request.ctx.principal.user_id, name=body.name,
        scopes=body.scopes, templates=body.templates, expires_at=body.expires_at,
        workspace_id=body.workspace_id,
    )
    return json({"message": SUCCESS, "key_id": key.id, "key": secret,
                 "key_info": service.key_view(key)}, status=201)


@bp.get("", strict_slashes=False)
@documented("List your API keys (not revoked), oldest first", response=out.KeyList,
           errors={404: NOT_A_MEMBER, 422: BLANK_WORKSPACE},
           params=(WORKSPACE_FILTER,))
@protected(Role.USER)
async def list_keys(request: Request):
    keys = await service.list_keys(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                   workspace_id=workspace_arg(request))
    return json({"message": SUCCESS, "keys": [service.key_view(k) for k in keys]})


@bp.delete("/<key_id:str>")
@documented("Revoke an API key, at once on every process", response=out.KeyRevoked)
@protected(Role.USER)
async def revoke_key(request: Request, key_id: str):
    await service.revoke_key(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                             key_id=key_id)
    return json({"message": SUCCESS, "key_id": key_id})
