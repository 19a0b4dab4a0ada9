"""Answer shapes of teams (SPEC §16): workspaces and their members."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestra.services.workspace_rights import WORKSPACE_ROLES
from orchestra.web.apidoc.models import Shape, Success, Timestamp
from orchestra.web.apidoc.operation import query
from orchestra.web.apidoc.rules import ID_PATTERN

WorkspaceRoleName = Literal[tuple(WORKSPACE_ROLES)]  # type: ignore[valid-type]

# What every list and create of a workspace's resources documents alike.
NOT_A_MEMBER = "NotFoundError: workspace_id names a workspace you are not a member of."
BLANK_WORKSPACE = "ValidationError: a blank workspace_id."
WORKSPACE_FILTER = query("workspace_id", "Only this workspace's (404 when you are not a member); default: "
                         "all of yours.", type="string", pattern=ID_PATTERN)


class LimitsView(Shape):
    monthly_budget_usd: str | None = Field(
        description="USD all the workspace's runs may spend in a calendar month (UTC); null: no cap.")
    on_budget: Literal["fail", "pause"] = Field(
        description="What a run does when the month cannot pay its next call.")


class WorkspaceView(Shape):
    workspace_id: str
    name: str
    personal: bool = Field(description="The user's own workspace: never shared, never deleted.")
    role: WorkspaceRoleName = Field(description="The caller's role here (a SUPER_ADMINISTRATOR: owner).")
    limits: LimitsView
    created_at: Timestamp


class WorkspaceCreated(Success):
    workspace_id: str
    workspace: WorkspaceView


class WorkspaceOne(Success):
    workspace_id: str
    workspace: WorkspaceView


class WorkspaceList(Success):
    workspaces: list[WorkspaceView]


class MemberView(Shape):
    user_id: str
    user_name: str
    role: WorkspaceRoleName


class MemberOne(Success):
    workspace_id: str
    member: MemberView


class MemberList(Success):
    workspace_id: str
    members: list[MemberView]
