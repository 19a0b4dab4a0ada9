"""Schedules and outbound event subscriptions (SPEC §11):

- `workflow_schedule`: a cron (five fields) in a time zone, what to run and as whom;
  `next_due_at` (naive UTC) is the next due time not yet handled — the fire loop of any
  process claims a schedule whose `next_due_at` has come (row lock, SKIP LOCKED).
- `schedule_fire`: one row per handled due time; the unique `(schedule_id, due_at)` is
  what makes a due time fire exactly once, whichever process gets there.
- `event_subscription`: a user's URL told of their runs' events (secret encrypted).
- `webhook_delivery`: the outbox, one row per matching run event, inserted in the
  transaction that stores the event; claimed by one process at a time (`claim_token`,
  `claim_until`), its attempts kept with their response codes.
- `workflow_run.trigger`, unless migration 0012 (API keys and hooks) added it.

Frozen copies of the models as they are at this migration.
"""

import datetime as dt
import json
import uuid

from peewee import (
    BooleanField,
    CharField,
    DateTimeField,
    IntegerField,
    Model,
    TextField,
)


def utcnow():
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def new_id():
    return str(uuid.uuid4())


class JSONField(TextField):

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"))

    def python_value(self, value):
        return None if value is None else json.loads(value)


class WorkflowSchedule(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    cron = CharField(max_length=256)
    timezone = CharField(max_length=64)
    input = JSONField(null=True)
    overlap = CharField(max_length=16)
    catchup = CharField(max_length=8)
    catchup_window_seconds = IntegerField()
    enabled = BooleanField(default=True)
    next_due_at = DateTimeField(null=True, index=True)
    last_trace_id = CharField(max_length=36, null=True)
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "workflow_schedule"


class ScheduleFire(Model):
    due_at = DateTimeField()
    outcome = CharField(max_length=16)
    trace_id = CharField(max_length=36, null=True)
    error = TextField(null=True)
    fired_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "schedule_fire"


class EventSubscription(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    url = CharField(max_length=2048)
    events = JSONField()
    secret_encrypted = TextField()
    created_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "event_subscription"


class WebhookDelivery(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    event = CharField(max_length=32)
    trace_id = CharField(max_length=36, index=True)
    payload = TextField()
    status = CharField(max_length=16)
    attempts = JSONField(default=list)
    next_attempt_at = DateTimeField(null=True)
    claim_token = CharField(max_length=36, null=True)
    claim_until = DateTimeField(null=True)
    created_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "webhook_delivery"


MODELS = [WorkflowSchedule, ScheduleFire, EventSubscription, WebhookDelivery]
# Foreign keys are added as plain columns (the frozen models have no User or template).
COLUMNS = (
    ("workflow_schedule", "owner_id", 'REFERENCES "user" (id) ON DELETE CASCADE'),
    ("workflow_schedule", "template_id", "REFERENCES workflow_template (id) ON DELETE CASCADE"),
    ("schedule_fire", "schedule_id", "REFERENCES workflow_schedule (id) ON DELETE CASCADE"),
    ("event_subscription", "owner_id", 'REFERENCES "user" (id) ON DELETE CASCADE'),
    ("event_subscription", "template_id", "REFERENCES workflow_template (id) ON DELETE CASCADE"),
    ("webhook_delivery", "subscription_id", "REFERENCES event_subscription (id) ON DELETE CASCADE"),
)
INDEXES = (
    ("workflow_schedule_owner_id", "workflow_schedule", "owner_id", False),
    ("workflow_schedule_template_id", "workflow_schedule", "template_id", False),
    ("schedule_fire_schedule_id_due_at", "schedule_fire", "schedule_id, due_at", True),
    ("event_subscription_owner_id", "event_subscription", "owner_id", False),
    ("event_subscription_template_id", "event_subscription", "template_id", False),
    ("webhook_delivery_subscription_id_created_at", "webhook_delivery", "subscription_id, created_at", False),
    ("webhook_delivery_status_next_attempt_at", "webhook_delivery", "status, next_attempt_at", False),
)


def _has_column(db, table, column):
    return any(c.name == column for c in db.get_columns(table))


def up(migrator, db):
    with db.bind_ctx(MODELS):
        db.create_tables(MODELS)
    for table, column, reference in COLUMNS:
        db.execute_sql(f"ALTER TABLE {table} ADD COLUMN {column} VARCHAR(36) NULL {reference}")
    for name, table, columns, unique in INDEXES:
        db.execute_sql(f"CREATE {'UNIQUE ' if unique else ''}INDEX {name} ON {table} ({columns})")
    if not _has_column(db, "workflow_run", "trigger"):
        db.execute_sql("ALTER TABLE workflow_run ADD COLUMN trigger TEXT NULL")


def down(migrator, db):
    with db.bind_ctx(MODELS):
        db.drop_tables(list(reversed(MODELS)))
