"""Machine access and triggers (SPEC §11), the part of API keys, idempotent starts and
inbound webhooks:

- `api_key`: a user's key, stored only as the SHA-256 of the secret (`key_hash`, unique);
  on PostgreSQL a trigger signals inserts, deletes and revocations on `orchestra_cache`
  (payload `api_key`) so every process drops its copy of the keys at once. Updates of
  `last_used_at` alone send nothing (they are bookkeeping, not access).
- `run_start_key`: one row per remembered start — an `Idempotency-Key` of a user
  (`scope` `user:<id>`) or a `webhook-id` of a hook (`scope` `hook:<id>`) — inserted in
  the transaction that stores the run: the unique `(scope, key)` makes concurrent
  duplicates on any number of processes start exactly one run.
- `webhook_hook`: an inbound webhook (its signing secret encrypted at rest).
- `workflow_run.trigger`: what started a run (`{kind: "webhook", …}`; null: a person).

Frozen copies of the models as they are at this migration.
"""

import datetime as dt
import json
import uuid

from peewee import CharField, DateTimeField, Model, PostgresqlDatabase, TextField


def utcnow():
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def new_id():
    return str(uuid.uuid4())


class JSONField(TextField):

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"))

    def python_value(self, value):
        return None if value is None else json.loads(value)


class ApiKey(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=128)
    key_hash = CharField(max_length=64, unique=True)
    prefix = CharField(max_length=16)
    scopes = JSONField(default=list)
    templates = JSONField(null=True)
    created_at = DateTimeField(default=utcnow)
    last_used_at = DateTimeField(null=True)
    expires_at = DateTimeField(null=True)
    revoked_at = DateTimeField(null=True)

    class Meta:
        table_name = "api_key"


class RunStartKey(Model):
    scope = CharField(max_length=64)
    key = CharField(max_length=255)
    fingerprint = CharField(max_length=64, null=True)
    created_at = DateTimeField(default=utcnow, index=True)

    class Meta:
        table_name = "run_start_key"
        indexes = ((("scope", "key"), True),)


class WebhookHook(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    input = TextField(default="body")
    secret_encrypted = TextField()
    created_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "webhook_hook"


def _postgres(db):
    return isinstance(db, PostgresqlDatabase)


# Foreign keys are added as plain columns (the frozen models have no User, run or template).
COLUMNS = (
    ("api_key", "user_id", 'REFERENCES "user" (id) ON DELETE CASCADE'),
    ("run_start_key", "trace_id", "REFERENCES workflow_run (trace_id) ON DELETE CASCADE"),
    ("webhook_hook", "owner_id", 'REFERENCES "user" (id) ON DELETE CASCADE'),
    ("webhook_hook", "template_id", "REFERENCES workflow_template (id) ON DELETE CASCADE"),
)
INDEXES = (
    ("api_key", "user_id"),
    ("run_start_key", "trace_id"),
    ("webhook_hook", "owner_id"),
    ("webhook_hook", "template_id"),
)
TRIGGER = (
    'CREATE TRIGGER api_key_notify AFTER INSERT OR DELETE OR UPDATE OF revoked_at, expires_at '
    'ON "api_key" FOR EACH STATEMENT EXECUTE FUNCTION orchestra_notify_cache()'
)


def up(migrator, db):
    models = [ApiKey, RunStartKey, WebhookHook]
    with db.bind_ctx(models):
        db.create_tables(models)
    for table, column, reference in COLUMNS:
        db.execute_sql(f"ALTER TABLE {table} ADD COLUMN {column} VARCHAR(36) NULL {reference}")
    for table, column in INDEXES:
        db.execute_sql(f"CREATE INDEX {table}_{column} ON {table} ({column})")
    db.execute_sql('ALTER TABLE workflow_run ADD COLUMN "trigger" TEXT NULL')
    if _postgres(db):
        db.execute_sql(TRIGGER)


def down(migrator, db):
    if _postgres(db):
        db.execute_sql('DROP TRIGGER IF EXISTS api_key_notify ON "api_key"')
    models = [ApiKey, RunStartKey, WebhookHook]
    with db.bind_ctx(models):
        db.drop_tables(models)
    migrator.migrate(migrator.drop_column("workflow_run", "trigger"))
