"""`/api/v1/resource`: the tool catalog and shared skills."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.services import agents
from orchestra.services import mcp as mcp_service
from orchestra.services.roles import Role
from orchestra.services.workspace_rights import Action
from orchestra.web.apidoc import models as out
from orchestra.web.apidoc.operation import Link, documented, query
from orchestra.web.apidoc.rules import ID_PATTERN, name_rule, text_rule
from orchestra.web.apidoc.workspace_shapes import BLANK_WORKSPACE, NOT_A_MEMBER
from orchestra.web.auth import protected
from orchestra.web.paging import workspace_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, ClosedBody, parse_body

bp = Blueprint("resource", url_prefix="/resource")



class SkillBody(Body):
    name: str = name_rule()
    description: str = text_rule("")
    instructions: str = text_rule("", long=True)


class SkillUpdateBody(ClosedBody):
    """Only the fields sent change; null is refused."""

    name: str = name_rule(None)
    description: str = text_rule(None)
    instructions: str = text_rule(None, long=True)


@bp.get("/tool")
@documented("The tool catalog: the built-ins and the instance-wide MCP servers' tools, with a workspace's "
            "own servers' tools for workspace_id", response=out.ToolList, params=(query(
                "workspace_id", "The tools a worker of this workspace may use (404 when you are not a "
                "member); default: the built-ins and the instance-wide servers' tools.",
                type="string", pattern=ID_PATTERN),), errors={404: NOT_A_MEMBER, 422: BLANK_WORKSPACE})
@protected(Role.USER)
async def tools(request: Request):
    core = request.app.ctx.core
    workspace_id = await mcp_service.scope_of(core, request.ctx.principal, workspace_arg(request), Action.READ)
    return json({"message": SUCCESS, "tools": await agents.list_tools(core, workspace_id)})


@bp.post("/skill")
@documented(
    "Create a shared skill", body=SkillBody, response=out.Skill, status=201,
    errors={409: "ConflictError: the name is taken (ignoring case)."},
    links={
        "Read": Link("resource.read_skill", {"skill_id": "$response.body#/skill_id"}),
        "Update": Link("resource.update_skill", {"skill_id": "$response.body#/skill_id"}),
        "Delete": Link("resource.delete_skill", {"skill_id": "$response.body#/skill_id"}),
    },
)
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
@documented("List the skills, oldest first", response=out.SkillList)
@protected(Role.USER)
async def list_skills(request: Request):
    rows = await agents.list_skills(request.app.ctx.core)
    return json({"message": SUCCESS, "skills": [agents.skill_view(s) for s in rows]})


@bp.get("/skill/<skill_id:str>")
@documented("Read a skill", response=out.Skill)
@protected(Role.USER)
async def read_skill(request: Request, skill_id: str):
    skill = await agents.get_skill(request.app.ctx.core, skill_id)
    return json({"message": SUCCESS, **agents.skill_view(skill)})


@bp.put("/skill/<skill_id:str>")
@documented(
    "Change a skill (only the fields sent)", body=SkillUpdateBody, response=out.Skill,
    errors={409: "ConflictError: the name is taken (ignoring case)."},
)
@protected(Role.ADMINISTRATOR)
async def update_skill(request: Request, skill_id: str):
    body = parse_body(request, SkillUpdateBody)
    changes = {k: getattr(body, k) for k in body.model_fields_set}
    skill = await agents.update_skill(request.app.ctx.core, skill_id=skill_id, **changes)
    return json({"message": SUCCESS, **agents.skill_view(skill)})


@bp.delete("/skill/<skill_id:str>")
@documented(
    "Delete a skill", response=out.Done,
    errors={409: "ConflictError: workers are bound to it (detail names them)."},
)
@protected(Role.ADMINISTRATOR)
async def delete_skill(request: Request, skill_id: str):
    await agents.delete_skill(request.app.ctx.core, skill_id=skill_id)
    return json({"message": SUCCESS})
