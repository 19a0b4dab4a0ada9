"""Runs as a queue with owners: who holds a run, until when, how often it was claimed,
and whether a cancel was asked for. On PostgreSQL, triggers send the cross-process hints
(`orchestra_events` for new events, `orchestra_cache` for changed users, providers,
workers, skills and system nodes) so that no process has to poll.
"""

from peewee import BooleanField, CharField, DoubleField, IntegerField, PostgresqlDatabase

TRIGGERS = (  # one statement each: the driver prepares statements
    """CREATE OR REPLACE FUNCTION orchestra_notify_events() RETURNS trigger AS $$
DECLARE r record;
BEGIN
  FOR r IN SELECT run_id, max(seq) AS seq FROM new_rows GROUP BY run_id LOOP
    PERFORM pg_notify('orchestra_events', r.run_id || ':' || r.seq);
  END LOOP;
  RETURN NULL;
END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER run_event_notify AFTER INSERT ON run_event
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION orchestra_notify_events()""",
    """CREATE OR REPLACE FUNCTION orchestra_notify_cache() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('orchestra_cache', TG_TABLE_NAME);
  RETURN NULL;
END $$ LANGUAGE plpgsql""",
)
CACHED_TABLES = ("user", "provider", "skill", "worker", "system_node")


def up(migrator, db):
    migrator.migrate(
        migrator.add_column("workflow_run", "owner_process", CharField(max_length=128, null=True)),
        migrator.add_column("workflow_run", "lease_until", DoubleField(null=True)),
        migrator.add_column("workflow_run", "attempts", IntegerField(default=0)),
        migrator.add_column("workflow_run", "cancel_requested", BooleanField(default=False)),
        migrator.add_index("workflow_run", ("status", "lease_until")),
    )
    if isinstance(db, PostgresqlDatabase):
        for statement in TRIGGERS:
            db.execute_sql(statement)
        for table in CACHED_TABLES:
            db.execute_sql(
                f'CREATE TRIGGER {table}_notify AFTER INSERT OR UPDATE OR DELETE ON "{table}" '
                "FOR EACH STATEMENT EXECUTE FUNCTION orchestra_notify_cache()"
            )


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        for table in CACHED_TABLES:
            db.execute_sql(f'DROP TRIGGER IF EXISTS {table}_notify ON "{table}"')
        db.execute_sql("DROP TRIGGER IF EXISTS run_event_notify ON run_event")
        db.execute_sql("DROP FUNCTION IF EXISTS orchestra_notify_events()")
        db.execute_sql("DROP FUNCTION IF EXISTS orchestra_notify_cache()")
    migrator.migrate(
        migrator.drop_index("workflow_run", "workflow_run_status_lease_until"),
        migrator.drop_column("workflow_run", "cancel_requested"),
        migrator.drop_column("workflow_run", "attempts"),
        migrator.drop_column("workflow_run", "lease_until"),
        migrator.drop_column("workflow_run", "owner_process"),
    )
