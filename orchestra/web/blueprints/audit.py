"""`/api/v1/audit`: the audit log, read only (SPEC §16); who reads which chains is
`audit.readable_chains` (asking services/workspace_rights.py). No route changes or deletes an
entry: PUT, PATCH and DELETE answer 405 like any method a path does not take."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.db.models import storable
from orchestra.services import audit
from orchestra.services.roles import Role
from orchestra.web.apidoc.audit_shapes import AuditList
from orchestra.web.apidoc.operation import documented, query
from orchestra.web.apidoc.rules import ID_PATTERN
from orchestra.web.auth import protected
from orchestra.web.paging import page_args, page_params, raw_arg, workspace_arg
from orchestra.web.responses import SUCCESS

bp = Blueprint("audit", url_prefix="/audit")

TEXT_MAX = 255  # an actor, action or target id longer than any stored one matches nothing


def _text(request: Request, name: str) -> str | None:
    """A filter's value; blank is no filter. One no store could hold matches nothing."""
    value = raw_arg(request, name)
    if value is None or not value.strip():
        return None
    return value.strip() if storable(value) and len(value) <= TEXT_MAX else "\x1f-none"


def _instant(request: Request, name: str):
    value = raw_arg(request, name)
    return None if value is None else audit.parse_instant(name, value)


@bp.get("", strict_slashes=False)
@documented(
    "The audit log: who changed what, newest first (paged)", response=AuditList,
    description="Every change (templates, keys, secrets, runs, workspaces and members, users' "
    "authority and deletion, logins) is one entry, written in the change's transaction. A "
    "SUPER_ADMINISTRATOR sees every chain, the instance chain included; a workspace's owners "
    "and admins see its chain (`workspace_id`), and without it every chain of a workspace "
    "where they are admin or owner (never instance-level entries).",
    errors={403: "PermissionDeniedError: workspace_id names a workspace where your role is below "
                 "admin (`detail.role_needed`).",
            404: "NotFoundError: workspace_id names a workspace you are not a member of.",
            422: "ValidationError: limit out of range, a cursor not of this list's form, or "
                 "from/to not a date or date-time."},
    params=(
        *page_params("entries"),
        query("workspace_id", "Only this workspace's chain (admin or owner there; 404 when you are "
              "not a member).", type="string", pattern=ID_PATTERN),
        query("actor", "Only entries by this user (a user_id or a user_name).", type="string"),
        query("action", "Only this action, exactly (template.update).", type="string"),
        query("target_id", "Only entries about this resource id.", type="string"),
        query("from", "From this UTC date (2026-12-01) or date-time, included.", type="string",
              format="date"),
        query("to", "Before this UTC date or date-time (excluded).", type="string", format="date"),
    ),
)
@protected(Role.USER)
async def list_entries(request: Request):
    limit, cursor = page_args(request)
    core = request.app.ctx.core
    chains = await audit.readable_chains(core, request.ctx.principal, workspace_arg(request))
    page = await audit.list_entries(
        core, actor=_text(request, "actor"), action=_text(request, "action"),
        target_id=_text(request, "target_id"), since=_instant(request, "from"),
        until=_instant(request, "to"), limit=limit, cursor=cursor, chains=chains)
    return json({"message": SUCCESS, "entries": [audit.view(e) for e in page.rows],
                 "next_cursor": page.next_cursor})
