"""`/api/v1/resource`: the tool catalog and shared skills."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json
from sanic_ext import openapi

from orchestra.services import agents
from orchestra.services.roles import Role
from orchestra.web.auth import protected
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("resource", url_prefix="/resource")



class SkillBody(Body):
    name: str
    description: str = ""
    instructions: str = ""


class SkillUpdateBody(ClosedBody):
    """Only the fields sent change; null is refused."""

    name: str = None  # type: ignore[assignment]
    description: str = None  # type: ignore[assignment]
    instructions: str = None  # type: ignore[assignment]


@bp.get("/tool")
@openapi.response(200, description="message, tools: [{name, description, parameters}].")
@openapi.secured("bearer")
@protected(Role.USER)
async def tools(request: Request):
    return json({"message": SUCCESS, "tools": agents.list_tools(request.app.ctx.core)})


@bp.post("/skill")
@openapi.body({"application/json": SkillBody}, required=True)
@openapi.response(201, description="The skill.")
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def create_skill(request: Request):
    body = parse_body(request, SkillBody)
    skill = await agents.create_skill(
        request.app.ctx.core,
        name=body.name,
        description=body.description,
        instructions=body.instructions,
    )
    return json({"message": SUCCESS, **agents.skill_view(skill)}, status=201)


@bp.get("/skill")
@openapi.secured("bearer")
@protected(Role.USER)
async def list_skills(request: Request):
    rows = await agents.list_skills(request.app.ctx.core)
    return json({"message": SUCCESS, "skills": [agents.skill_view(s) for s in rows]})


@bp.get("/skill/<skill_id:str>")
@openapi.secured("bearer")
@protected(Role.USER)
async def read_skill(request: Request, skill_id: str):
    skill = await agents.get_skill(request.app.ctx.core, skill_id)
    return json({"message": SUCCESS, **agents.skill_view(skill)})


@bp.put("/skill/<skill_id:str>")
@openapi.body({"application/json": SkillUpdateBody}, required=True)
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def update_skill(request: Request, skill_id: str):
    body = parse_body(request, SkillUpdateBody)
    changes = {k: getattr(body, k) for k in body.model_fields_set}
    skill = await agents.update_skill(request.app.ctx.core, skill_id=skill_id, **changes)
    return json({"message": SUCCESS, **agents.skill_view(skill)})


@bp.delete("/skill/<skill_id:str>")
@openapi.secured("bearer")
@protected(Role.ADMINISTRATOR)
async def delete_skill(request: Request, skill_id: str):
    await agents.delete_skill(request.app.ctx.core, skill_id=skill_id)
    return json({"message": SUCCESS})
