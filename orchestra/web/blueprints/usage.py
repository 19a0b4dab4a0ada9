"""`/api/v1/usage`: what runs' model calls used and cost, grouped (SPEC §12)."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.services import spend as spend_service
from orchestra.services.roles import Role
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import documented, query
from orchestra.web.apidoc.workspace_shapes import NOT_A_MEMBER, WORKSPACE_FILTER
from orchestra.web.auth import protected
from orchestra.web.paging import workspace_arg
from orchestra.web.responses import SUCCESS

bp = Blueprint("usage", url_prefix="/usage")


@bp.get("", strict_slashes=False)
@documented(
    "Usage and cost of model calls, grouped by user, template, provider, model, day or workspace",
    response=out.UsageReport,
    description="Your own runs' and your team workspaces' step instances that called a model (an "
    "administrator sees everyone's but those of team workspaces it is not a member of), grouped; a step counts on the UTC day it finished. cost_usd is an exact "
    "decimal string, null when nothing in the group was priced.",
    errors={404: NOT_A_MEMBER,
            422: "ValidationError: group_by is not one of its values, from/to is not a date or "
                 "date-time, or a blank workspace_id."},
    params=(
        query("group_by", "user | template | provider | model | day | workspace (default day).",
              type="string", enum=list(spend_service.GROUPS)),
        query("from", "From this UTC date (2026-11-01) or date-time, included.", type="string", format="date"),
        query("to", "Up to this UTC date (included) or date-time (excluded).", type="string", format="date"),
        WORKSPACE_FILTER,
    ),
)
@protected(Role.USER)
async def usage(request: Request):
    principal = request.ctx.principal
    args = request.get_args(keep_blank_values=True)  # `to=` is a bad date, not an absent one
    rows = await spend_service.usage(
        request.app.ctx.core, user_id=principal.user_id, is_admin=principal.is_admin,
        group_by=(request.args.get("group_by") or "day").strip(),
        start=args.get("from"), end=args.get("to"), workspace_id=workspace_arg(request))
    return json({"message": SUCCESS, "rows": rows})
