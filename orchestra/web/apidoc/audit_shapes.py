"""Answer shapes of the audit log (SPEC §16), for the OpenAPI document."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from orchestra.web.apidoc.models import NextCursor, Shape, Success, Timestamp


class AuditActor(Shape):
    user_id: str | None = Field(description="null: the store's own command line (via store).")
    user_name: str | None
    key_id: str | None = Field(None, description="The API key used (via key only).")
    via: Literal["token", "key", "hook", "schedule", "store"]


class AuditTarget(Shape):
    type: str = Field(description="template, key, secret, run or user.")
    id: str | None
    name: str | None


class AuditEntryView(Shape):
    audit_id: str
    seq: int = Field(description="Its place in its chain: the previous entry's plus one.")
    at: Timestamp
    actor: AuditActor
    workspace_id: str | None = Field(description="Its chain; null: the instance chain.")
    action: str = Field(description="<type>.<verb>: template.update, run.start, auth.login, …")
    target: AuditTarget
    request_id: str | None = Field(description="The X-Request-ID of the request that made the change.")
    client_ip: str | None
    changes: dict[str, Any] = Field(description='{field: {"from", "to"}}; secret values and API keys as "***".')
    prev_hash: str = Field(description="The previous entry's hash (empty for a chain's first).")
    hash: str = Field(description="SHA-256 (hex) of the entry's canonical JSON, hash left out.")


class AuditList(Success):
    entries: list[AuditEntryView]
    next_cursor: str | None = NextCursor()
