"""A run remembers the trace it belongs to: the W3C `traceparent` of the request that
started it (see orchestra/observability/tracing.py), so whichever process executes the
run — at first, or after a take-over — puts its spans in that same trace.
"""

from peewee import CharField


def up(migrator, db):
    migrator.migrate(
        migrator.add_column("workflow_run", "trace_parent", CharField(max_length=64, null=True)),
    )


def down(migrator, db):
    migrator.migrate(migrator.drop_column("workflow_run", "trace_parent"))
