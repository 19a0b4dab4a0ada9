"""MCP servers (SPEC §9): one `mcp_server` table; on PostgreSQL a trigger sends the
`orchestra_cache` hint on every change, as for workers (migration 0003), so every
process drops its copy of the MCP tool catalog.

A frozen copy of the model as it was at this migration, independent of
orchestra.db.models so later model changes never alter it.
"""

import datetime as dt
import json
import uuid

from peewee import CharField, DateTimeField, DoubleField, Model, PostgresqlDatabase, TextField


def utcnow():
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def new_id():
    return str(uuid.uuid4())


class JSONField(TextField):

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"))

    def python_value(self, value):
        return None if value is None else json.loads(value)


class McpServer(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=64, unique=True)
    name_key = CharField(max_length=256, unique=True)
    transport = CharField(max_length=32)
    url = CharField(max_length=1024, null=True)
    command = CharField(max_length=1024, null=True)
    args = JSONField(default=list)
    headers_encrypted = TextField(null=True)
    headers_hint = JSONField(default=dict)
    env_encrypted = TextField(null=True)
    env_hint = JSONField(default=dict)
    timeout_seconds = DoubleField(default=30.0)
    tools = JSONField(default=list)
    last_error = TextField(null=True)
    refreshed_at = DateTimeField(null=True)
    # created_by: a plain column with the foreign key added below (the frozen model
    # has no User to point at).
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "mcp_server"


def _postgres(db):
    return isinstance(db, PostgresqlDatabase)


def up(migrator, db):
    with db.bind_ctx([McpServer]):
        db.create_tables([McpServer])
    reference = 'REFERENCES "user" (id) ON DELETE SET NULL'
    db.execute_sql(f'ALTER TABLE mcp_server ADD COLUMN created_by_id VARCHAR(36) NULL {reference}')
    if _postgres(db):
        db.execute_sql(
            'CREATE TRIGGER mcp_server_notify AFTER INSERT OR UPDATE OR DELETE ON "mcp_server" '
            "FOR EACH STATEMENT EXECUTE FUNCTION orchestra_notify_cache()"
        )


def down(migrator, db):
    if _postgres(db):
        db.execute_sql('DROP TRIGGER IF EXISTS mcp_server_notify ON "mcp_server"')
    with db.bind_ctx([McpServer]):
        db.drop_tables([McpServer])
