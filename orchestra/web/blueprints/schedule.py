"""`/api/v1/workflow/schedule`: runs started on a clock (SPEC §11). A schedule is its
owner's, or its team workspace's members' by role (SPEC §16): others get 404."""

from __future__ import annotations

from typing import Any, Literal

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.services import cron as cron_rules
from orchestra.services import schedules as service
from orchestra.services.roles import Role
from orchestra.web.apidoc import trigger_shapes as out
from orchestra.web.apidoc.models import Done
from orchestra.web.apidoc.operation import Link, documented
from orchestra.web.apidoc.rules import id_rule, rule
from orchestra.web.apidoc.workspace_shapes import NOT_A_MEMBER, WORKSPACE_FILTER
from orchestra.web.auth import protected
from orchestra.web.paging import PAGE_ERRORS, page_args, page_body, page_params, workspace_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("schedule", url_prefix="/workflow/schedule")

_ID = {"schedule_id": "$response.body#/schedule_id"}
_UNKNOWN = ("ValidationError: an impossible or six-field cron (`cron`), an unknown zone "
            "(`timezone`), a template you may not run or of another workspace (`template_id`), "
            "an input the template refuses (`input`).")
_BELOW = "PermissionDeniedError: your role in the schedule's workspace is below editor (`detail.role_needed`)."


class ScheduleBody(Body):
    template_id: str = id_rule(description="A template you may run (yours or shared); 422 otherwise.")
    cron: str = rule(
        description="Five fields: minute hour day-of-month month day-of-week (`*/15 9-17 * * 1-5`). "
        "Six fields, or a date that never comes (`0 0 30 2 *`), is 422.",
        maxLength=cron_rules.CRON_MAX, pattern=r"^\s*\S+(\s+\S+){4}\s*$",
    )
    timezone: str = rule("UTC", description="An IANA zone (`Europe/Paris`); due times follow its "
                         "daylight-saving rules.", maxLength=cron_rules.ZONE_MAX, minLength=1)
    input: Any = rule(None, description="The run's input: text, or any JSON value the template's "
                      "input_schema accepts (checked when saved and at each fire).")
    overlap: Literal["skip", "allow", "cancel_previous"] = rule(
        "skip", description="A fire while the schedule's last run is still active: skip it (recorded "
        "`skipped`), start another, or cancel the active one and start.")
    catchup: Literal["none", "latest", "all"] = rule(
        "latest", description="Due times missed while no process could fire them (more than 60 s "
        "late), within catchup_window_seconds: none, the newest, or all.")
    catchup_window_seconds: int = rule(service.WINDOW_DEFAULT, description="How far back missed "
                                       "due times are made up.", minimum=0, maximum=service.WINDOW_MAX)
    enabled: bool = True

    def fields(self) -> dict[str, Any]:
        return self.model_dump()


class NewScheduleBody(ScheduleBody):
    workspace_id: str | None = id_rule(None, description="The workspace it belongs to (you need editor "
                                       "there; 404 when you are not a member); default: your personal "
                                       "one. Its template must be of the same workspace (or shared).")


async def _answer(request: Request, row, status: int = 200):
    core = request.app.ctx.core
    last = (await service.last_fires(core, [row.id])).get(row.id)
    view = service.schedule_view(row, last)
    return json({"message": SUCCESS, "schedule_id": row.id, "schedule": view}, status=status)


@bp.post("", strict_slashes=False)
@documented(
    "Create a schedule", body=NewScheduleBody, response=out.Schedule, status=201,
    errors={403: _BELOW, 404: NOT_A_MEMBER, 422: _UNKNOWN},
    links={
        "Read": Link("schedule.read", _ID),
        "Replace": Link("schedule.update", _ID),
        "Delete": Link("schedule.delete", _ID),
    },
)
@protected(Role.USER)
async def create(request: Request):
    body = parse_body(request, NewScheduleBody)
    row = await service.create_schedule(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                        body=body.fields())
    return await _answer(request, row, 201)


@bp.get("", strict_slashes=False)
@documented("List your schedules and your workspaces', oldest first, with their next fires and "
            "last outcome", response=out.ScheduleList, params=(*page_params("schedules"), WORKSPACE_FILTER),
            errors={404: NOT_A_MEMBER, 422: PAGE_ERRORS})
@protected(Role.USER)
async def list_all(request: Request):
    limit, cursor = page_args(request)
    core = request.app.ctx.core
    page = await service.list_schedules(core, user_id=request.ctx.principal.user_id, limit=limit, cursor=cursor,
                                        workspace_id=workspace_arg(request))
    last = await service.last_fires(core, [row.id for row in page.rows])
    return json(page_body("schedules", [service.schedule_view(r, last.get(r.id)) for r in page.rows], page))


@bp.get("/<schedule_id:str>")
@documented("Read a schedule: its next 5 due times and its last fire", response=out.Schedule)
@protected(Role.USER)
async def read(request: Request, schedule_id: str):
    row = await service.get_schedule(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                     schedule_id=schedule_id)
    return await _answer(request, row)


@bp.get("/<schedule_id:str>/fires")
@documented("A schedule's fires, newest due time first: each handled due time's outcome and run",
            response=out.FireList, params=page_params("fires", 50), errors={422: PAGE_ERRORS})
@protected(Role.USER)
async def fires(request: Request, schedule_id: str):
    limit, cursor = page_args(request, default=50)
    row, page, statuses = await service.list_fires(
        request.app.ctx.core, user_id=request.ctx.principal.user_id, schedule_id=schedule_id,
        limit=limit, cursor=cursor)
    tz = service.zone_of(row)
    items = [service.fire_view(f, tz, statuses.get(f.trace_id)) for f in page.rows]
    return json({**page_body("fires", items, page), "schedule_id": row.id, "timezone": row.timezone})


@bp.put("/<schedule_id:str>")
@documented("Replace a schedule (every field; a changed cron, zone or enabled counts from now)",
            body=ScheduleBody, response=out.Schedule, errors={403: _BELOW, 422: _UNKNOWN})
@protected(Role.USER)
async def update(request: Request, schedule_id: str):
    body = parse_body(request, ScheduleBody)
    row = await service.update_schedule(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                        schedule_id=schedule_id, body=body.fields())
    return await _answer(request, row)


@bp.delete("/<schedule_id:str>")
@documented("Delete a schedule (its runs stay)", response=Done, errors={403: _BELOW})
@protected(Role.USER)
async def delete(request: Request, schedule_id: str):
    await service.delete_schedule(request.app.ctx.core, user_id=request.ctx.principal.user_id,
                                  schedule_id=schedule_id)
    return json({"message": SUCCESS})
