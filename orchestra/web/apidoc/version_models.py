"""The shapes of the versions and fork answers (SPEC §13), for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from orchestra.web.apidoc.models import RunStarted, Shape, Success, TemplateView, Timestamp


class VersionSummary(Shape):
    version: int = Field(ge=1)
    created_at: Timestamp
    author_id: str | None = Field(description="Who saved it (null once that user is deleted).")
    author_name: str | None = Field(None, description="That user's name now (in the list; null once deleted).")
    step_count: int = Field(ge=0, description="Every step with an id, inner steps of foreach and loop included.")


class VersionList(Success):
    template_id: str
    versions: list[VersionSummary] = Field(description="Newest first.")


class VersionView(VersionSummary):
    template_id: str
    name: str
    description: str
    steps: list[dict[str, Any]] = Field(description="The steps as that save stored them, each worker by its current name.")
    input_schema: dict[str, Any] | None = Field(None, description="Only when that version has one.")
    limits: dict[str, Any] | None = Field(None, description="Only when that version has them.")
    output: str | None = Field(None, description="Only when that version has one.")
    output_schema: dict[str, Any] | None = Field(None, description="Only when that version has one.")
    expose: dict[str, Any] | None = Field(None, description='`{"mcp": true}` when that version was '
                                          "offered as an MCP tool.")


class Version(Success):
    template_id: str
    version: VersionView


class ChangedStep(Shape):
    step_id: str
    fields: list[str] = Field(description="The step's own top-level keys that differ (added or removed "
                                          "included; a container's inner steps are not its own keys).")


class VersionDiff(Success):
    template_id: str
    from_: int = Field(alias="from", ge=1)
    to: int = Field(ge=1)
    added: list[str] = Field(description="Step ids only in `to` (inner steps by their own ids).")
    removed: list[str] = Field(description="Step ids only in `from`.")
    changed: list[ChangedStep]
    template_fields: list[str] = Field(description="Changed top-level names (name, description, "
                                                   "input_schema, limits, output, output_schema, "
                                                   "expose); never steps.")


class Restored(Success):
    template_id: str
    version: int = Field(ge=1, description="The new version: a copy of the restored one's content.")
    restored_from: int = Field(ge=1)
    template: TemplateView


class RunForked(RunStarted):
    forked_from: str = Field(description="The run forked.")
