"""Stored things of machine access and triggers (SPEC §11): API keys, remembered starts
(idempotency keys and webhook ids) and inbound webhooks. The schema is migration 0012."""

from __future__ import annotations

from peewee import CharField, DateTimeField, ForeignKeyField, TextField

from orchestra.db.models import (
    BaseModel,
    JSONField,
    User,
    WorkflowRun,
    WorkflowTemplate,
    new_id,
    utcnow,
)


class ApiKey(BaseModel):
    """A user's API key. Only the SHA-256 of the secret is kept (`key_hash`): the secret
    is 32 random bytes, so a fast hash is as safe as a slow one and costs microseconds
    per request (docs/operations.md, "API keys")."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    user = ForeignKeyField(User, on_delete="CASCADE", index=True)
    name = CharField(max_length=128)
    key_hash = CharField(max_length=64, unique=True)
    prefix = CharField(max_length=16)  # the first 8 characters after `orc_`, for display
    scopes = JSONField(default=list)
    templates = JSONField(null=True)  # template ids run:start is limited to; null: any
    created_at = DateTimeField(default=utcnow)
    last_used_at = DateTimeField(null=True)
    expires_at = DateTimeField(null=True)
    revoked_at = DateTimeField(null=True)
    workspace_id = CharField(max_length=36, null=True, index=True)  # SPEC §16 (migration 0021)


class RunStartKey(BaseModel):
    """A start remembered for 24 h: an `Idempotency-Key` (`scope` `user:<id>`) or a
    webhook's `webhook-id` (`scope` `hook:<id>`). Inserted with its run, in one
    transaction; the unique `(scope, key)` lets one of any number of racing duplicates win."""

    scope = CharField(max_length=64)
    key = CharField(max_length=255)
    fingerprint = CharField(max_length=64, null=True)  # SHA-256 of the request that started it
    run = ForeignKeyField(WorkflowRun, column_name="trace_id", on_delete="CASCADE", index=True)
    created_at = DateTimeField(default=utcnow, index=True)

    class Meta:
        indexes = ((("scope", "key"), True),)


class WebhookHook(BaseModel):
    """An inbound webhook: a public URL that starts runs of `template` as `owner`, its
    calls signed per Standard Webhooks with `secret` (kept encrypted: verifying needs it)."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    template = ForeignKeyField(WorkflowTemplate, on_delete="CASCADE", index=True)
    input = TextField(default="body")  # CEL over body, headers, query: the run's input
    secret_encrypted = TextField()
    workspace_id = CharField(max_length=36, null=True, index=True)  # SPEC §16 (migration 0019)
    created_at = DateTimeField(default=utcnow)
