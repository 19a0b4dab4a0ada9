"""Models of what starts runs on a clock and what tells other systems about them
(SPEC §11): schedules and their fires, event subscriptions and their deliveries
(the outbox). The schema is migration 0013."""

from __future__ import annotations

from peewee import BooleanField, CharField, DateTimeField, ForeignKeyField, IntegerField, TextField

from orchestra.db.models import BaseModel, JSONField, User, WorkflowTemplate, new_id, utcnow


class WorkflowSchedule(BaseModel):
    """A cron in a time zone that starts runs of a template as its owner.
    `next_due_at` (naive UTC) is the next due time not yet handled by any process."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    template = ForeignKeyField(WorkflowTemplate, on_delete="CASCADE", index=True)
    cron = CharField(max_length=256)
    timezone = CharField(max_length=64)
    input = JSONField(null=True)
    overlap = CharField(max_length=16)
    catchup = CharField(max_length=8)
    catchup_window_seconds = IntegerField()
    enabled = BooleanField(default=True)
    next_due_at = DateTimeField(null=True, index=True)
    last_trace_id = CharField(max_length=36, null=True)  # the last run a fire started
    workspace_id = CharField(max_length=36, null=True, index=True)  # SPEC §16: its template's
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)


class ScheduleFire(BaseModel):
    """One handled due time: `started` (with its run), `skipped` (overlap), `missed`
    (catch-up policy), or `failed` (the run could not be started: error)."""

    schedule = ForeignKeyField(WorkflowSchedule, on_delete="CASCADE")
    due_at = DateTimeField()
    outcome = CharField(max_length=16)
    trace_id = CharField(max_length=36, null=True)
    error = TextField(null=True)
    fired_at = DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("schedule", "due_at"), True),)


class EventSubscription(BaseModel):
    """A URL told of the owner's runs' events (optionally of one template's runs)."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    owner = ForeignKeyField(User, on_delete="CASCADE", index=True)
    template = ForeignKeyField(WorkflowTemplate, null=True, on_delete="CASCADE", index=True)
    url = CharField(max_length=2048)
    events = JSONField()
    secret_encrypted = TextField()
    workspace_id = CharField(max_length=36, null=True, index=True)  # SPEC §16 (migration 0021)
    created_at = DateTimeField(default=utcnow)


class WebhookDelivery(BaseModel):
    """One queued event for one subscription: its body is fixed when queued, so every
    attempt sends the same bytes under the same `webhook-id` (`msg_<id>`)."""

    id = CharField(primary_key=True, max_length=36, default=new_id)
    subscription = ForeignKeyField(EventSubscription, on_delete="CASCADE")
    event = CharField(max_length=32)
    trace_id = CharField(max_length=36, index=True)
    payload = TextField()
    status = CharField(max_length=16)  # pending | delivered | failed
    attempts = JSONField(default=list)  # [{at, response_code, error}]
    next_attempt_at = DateTimeField(null=True)
    claim_token = CharField(max_length=36, null=True)  # the process attempting it now
    claim_until = DateTimeField(null=True)
    created_at = DateTimeField(default=utcnow)

    class Meta:
        indexes = ((("subscription", "created_at"), False), (("status", "next_attempt_at"), False))
