"""`/api/v1/workspace`: workspaces and their members (SPEC §16). The rights are
services/workspace_rights.py's, asked by the service: a workspace the caller is not a
member of is 404, a member without the right 403 naming the least role that has it."""

from __future__ import annotations

from typing import Any, Literal

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.errors import ValidationError
from orchestra.money.amounts import USD_JSON_SCHEMA
from orchestra.services import workspaces as service
from orchestra.services.roles import Role
from orchestra.services.workspace_rights import WORKSPACE_ROLES
from orchestra.web.apidoc import workspace_shapes as out
from orchestra.web.apidoc.operation import Link, documented, query
from orchestra.web.apidoc.rules import ID_PATTERN, rule, stripped
from orchestra.web.auth import protected
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("workspace", url_prefix="/workspace")

_ID = {"workspace_id": "$response.body#/workspace_id"}
_MEMBER = {"workspace_id": "$response.body#/workspace_id", "user_id": "$response.body#/member/user_id"}
_LIMITS_422 = ("ValidationError: a name out of bounds (`name`), a negative or malformed "
               "`limits.monthly_budget_usd`, an `on_budget` other than fail or pause (`limits.on_budget`).")
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
          "off": False, "": False}


class Limits(ClosedBody):
    monthly_budget_usd: Any = rule(
        None, description="USD all the workspace's runs may spend in a calendar month (UTC): a "
        "number or decimal string, not negative; null or absent: no cap.",
        anyOf=[{"type": "null"}, *USD_JSON_SCHEMA["anyOf"]])
    on_budget: Literal["fail", "pause"] = rule(
        "fail", description="When the month cannot pay a run's next call: fail the run, or pause it "
        "(`waiting_budget`).")


class WorkspaceBody(Body):
    name: str = rule(description=f"1-{service.NAME_MAX} characters (NFKC, stripped).",
                     pattern=stripped(service.NAME_MAX))
    limits: Limits | None = None


class WorkspaceChange(Body):
    name: str | None = rule(None, description="A new name; absent: unchanged.",
                            pattern=stripped(service.NAME_MAX))
    limits: Limits | None = rule(None, description="The new limits (replacing the old); null: none; "
                                 "absent: unchanged.")


_ROLE = rule(description="Lower case: " + ", ".join(WORKSPACE_ROLES) + ".",
             enum=list(WORKSPACE_ROLES))


class MemberBody(Body):
    user_name: str | None = rule(None, description="The user to add (or user_id).", maxLength=256)
    user_id: str | None = rule(None, description="The user to add (or user_name).", pattern=ID_PATTERN)
    role: str = _ROLE

    # one of the two names the user, as a string (the service's 422 otherwise)
    model_config = Body.model_config | {"json_schema_extra": {"anyOf": [
        {"required": ["user_name"], "properties": {"user_name": {"type": "string"}}},
        {"required": ["user_id"], "properties": {"user_id": {"type": "string"}}}]}}


class RoleBody(Body):
    role: str = _ROLE


def _limits(body: Body) -> dict[str, Any] | None:
    return body.limits.model_dump() if body.limits is not None else None


def _one(access) -> dict[str, Any]:
    return {"message": SUCCESS, "workspace_id": access.workspace.id,
            "workspace": service.workspace_view(access.workspace, access.role)}


@bp.post("", strict_slashes=False)
@documented(
    "Create a team workspace (you are its owner)", body=WorkspaceBody, response=out.WorkspaceCreated,
    status=201, errors={422: _LIMITS_422},
    links={
        "Read": Link("workspace.read", _ID),
        "Update": Link("workspace.update", _ID),
        "Delete": Link("workspace.delete", _ID),
        "Members": Link("workspace.list_members", _ID),
    },
)
@protected(Role.USER)
async def create(request: Request):
    body = parse_body(request, WorkspaceBody)
    principal = request.ctx.principal
    workspace = await service.create_workspace(request.app.ctx.core, principal, name=body.name,
                                               limits=_limits(body))
    return json({"message": SUCCESS, "workspace_id": workspace.id,
                 "workspace": service.workspace_view(workspace, "owner")}, status=201)


@bp.get("", strict_slashes=False)
@documented(
    "List your workspaces (your personal one first)", response=out.WorkspaceList,
    params=(query("all", "Every workspace of the install (SUPER_ADMINISTRATOR only; else 403).",
                  type="boolean"),),
    errors={403: "PermissionDeniedError: all=true by anyone but a SUPER_ADMINISTRATOR.",
            422: "ValidationError: all is neither true nor false."},
)
@protected(Role.USER)
async def list_all(request: Request):
    every = _FLAGS.get((request.args.get("all") or "").strip().lower())
    if every is None:
        raise ValidationError.field("all", "must be true or false (also 1/0, yes/no, on/off)")
    rows = await service.list_workspaces(request.app.ctx.core, request.ctx.principal, every=every)
    return json({"message": SUCCESS, "workspaces": [service.workspace_view(w, r) for w, r in rows]})


@bp.get("/<workspace_id:str>")
@documented("Read a workspace (any member)", response=out.WorkspaceOne)
@protected(Role.USER)
async def read(request: Request, workspace_id: str):
    found = await service.get_workspace(request.app.ctx.core, request.ctx.principal, workspace_id)
    return json(_one(found))


@bp.put("/<workspace_id:str>")
@documented("Change a workspace's name or limits (the fields sent; admin and above)",
            body=WorkspaceChange, response=out.WorkspaceOne, errors={422: _LIMITS_422})
@protected(Role.USER)
async def update(request: Request, workspace_id: str):
    body = parse_body(request, WorkspaceChange)
    fields: dict[str, Any] = {}
    if body.name is not None:
        fields["name"] = body.name
    if "limits" in body.model_fields_set:
        fields["limits"] = _limits(body)
    found = await service.update_workspace(request.app.ctx.core, request.ctx.principal, workspace_id,
                                           fields=fields)
    return json(_one(found))


@bp.delete("/<workspace_id:str>")
@documented(
    "Delete a team workspace and everything in it (owner only)", response=out.WorkspaceOne,
    errors={409: "ConflictError: a personal workspace, or one holding active runs or enabled schedules."},
)
@protected(Role.USER)
async def delete(request: Request, workspace_id: str):
    principal = request.ctx.principal
    core = request.app.ctx.core
    found = await service.get_workspace(core, principal, workspace_id)
    workspace = await service.delete_workspace(core, principal, workspace_id)
    return json({"message": SUCCESS, "workspace_id": workspace.id,
                 "workspace": service.workspace_view(workspace, found.role)})


# --- members -------------------------------------------------------------------------------


@bp.post("/<workspace_id:str>/member")
@documented(
    "Add a member with a role (admin and above; owner to grant owner)", body=MemberBody,
    response=out.MemberOne, status=201,
    errors={409: "ConflictError: a personal workspace (never shared), or the user is a member already.",
            422: "ValidationError: an unknown role, or no user named (user_name or user_id)."},
    links={"Update": Link("workspace.update_member", _MEMBER),
           "Remove": Link("workspace.remove_member", _MEMBER)},
)
@protected(Role.USER)
async def add_member(request: Request, workspace_id: str):
    body = parse_body(request, MemberBody)
    member = await service.add_member(request.app.ctx.core, request.ctx.principal, workspace_id,
                                      role=body.role, user_id=body.user_id, user_name=body.user_name)
    return json({"message": SUCCESS, "workspace_id": workspace_id, "member": member}, status=201)


@bp.get("/<workspace_id:str>/member")
@documented("List a workspace's members, owners first (any member)", response=out.MemberList)
@protected(Role.USER)
async def list_members(request: Request, workspace_id: str):
    members = await service.list_members(request.app.ctx.core, request.ctx.principal, workspace_id)
    return json({"message": SUCCESS, "workspace_id": workspace_id, "members": members})


@bp.put("/<workspace_id:str>/member/<user_id:str>")
@documented(
    "Change a member's role (admin and above; owner to grant or take owner)", body=RoleBody,
    response=out.MemberOne,
    errors={409: "ConflictError: demoting the last owner.", 422: "ValidationError: an unknown role."},
)
@protected(Role.USER)
async def update_member(request: Request, workspace_id: str, user_id: str):
    body = parse_body(request, RoleBody)
    member = await service.update_member(request.app.ctx.core, request.ctx.principal, workspace_id,
                                         user_id, role=body.role)
    return json({"message": SUCCESS, "workspace_id": workspace_id, "member": member})


@bp.delete("/<workspace_id:str>/member/<user_id:str>")
@documented(
    "Remove a member (admin and above; owner to remove an owner; any member may leave)",
    response=out.MemberOne, errors={409: "ConflictError: the last owner leaving."},
)
@protected(Role.USER)
async def remove_member(request: Request, workspace_id: str, user_id: str):
    member = await service.remove_member(request.app.ctx.core, request.ctx.principal, workspace_id, user_id)
    return json({"message": SUCCESS, "workspace_id": workspace_id, "member": member})
