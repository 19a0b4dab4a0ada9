"""Answer shapes of machine access and triggers (SPEC §11): API keys and inbound hooks."""

from __future__ import annotations

from pydantic import Field

from orchestra.web.apidoc.models import Shape, Success, Timestamp


class KeyInfo(Shape):
    key_id: str
    name: str
    prefix: str = Field(description="The first 8 characters after `orc_`, to tell keys apart.")
    scopes: list[str]
    templates: list[str] | None = Field(description="Templates run:start is limited to; null: any.")
    workspace_id: str | None = Field(description="The one workspace the key reaches (SPEC §16).")
    created_at: Timestamp
    last_used_at: Timestamp | None = Field(description="Kept to within a minute.")
    expires_at: Timestamp | None


class KeyCreated(Success):
    key_id: str
    key: str = Field(description="`orc_` + 43 characters: shown this once, stored only as a hash.")
    key_info: KeyInfo


class KeyList(Success):
    keys: list[KeyInfo]


class HookView(Shape):
    hook_id: str
    url: str = Field(description="Where senders POST (public, signed per Standard Webhooks).")
    template_id: str
    template_name: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16).")
    input: str = Field(description="CEL over body, headers and query: the run's input.")
    created_at: Timestamp


class HookCreated(Success):
    hook_id: str
    url: str
    secret: str = Field(description="`whsec_…`: shown this once (the signing secret).")
    hook: HookView


class Hook(Success):
    hook_id: str
    hook: HookView


class HookList(Success):
    hooks: list[HookView]


class HookCall(Success):
    trace_id: str = Field(description="The run this webhook-id started (the first time).")


class KeyRevoked(Success):
    key_id: str


class HookDeleted(Success):
    hook_id: str
