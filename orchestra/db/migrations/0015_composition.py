"""Composition (SPEC §14): the `secret` table (values as SecretBox ciphertext, a masked
hint for display), and the links between a parent run and its child runs:
`workflow_run.parent_trace_id`/`parent_path`/`depth` on the child, and
`run_step.child_trace_id` on the parent's step instance that started it.

A frozen copy of the table as it was at this migration, independent of
orchestra.db.models so later model changes never alter it.
"""

import datetime as dt
import uuid

from peewee import CharField, DateTimeField, IntegerField, Model, TextField


def utcnow():
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def new_id():
    return str(uuid.uuid4())


class Secret(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=64, unique=True)
    value_encrypted = TextField()
    hint = CharField(max_length=16)
    created_by = CharField(max_length=36, null=True)  # a user id (the user may be deleted since)
    created_at = DateTimeField(default=utcnow)
    updated_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "secret"


def up(migrator, db):
    with db.bind_ctx([Secret]):
        Secret.create_table(safe=True)
    migrator.migrate(
        migrator.add_column("workflow_run", "parent_trace_id", CharField(max_length=36, null=True, index=True)),
        migrator.add_column("workflow_run", "parent_path", CharField(max_length=512, null=True)),
        migrator.add_column("workflow_run", "depth", IntegerField(default=1)),
        migrator.add_column("run_step", "child_trace_id", CharField(max_length=36, null=True)),
    )


def down(migrator, db):
    migrator.migrate(
        migrator.drop_column("run_step", "child_trace_id"),
        migrator.drop_column("workflow_run", "depth"),
        migrator.drop_column("workflow_run", "parent_path"),
        migrator.drop_column("workflow_run", "parent_trace_id"),
    )
    with db.bind_ctx([Secret]):
        Secret.drop_table(safe=True)
