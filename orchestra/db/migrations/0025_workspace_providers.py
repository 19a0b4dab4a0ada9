"""Teams (SPEC §16), the providers part: `provider.workspace_id`, the workspace a model
provider belongs to (deleted with it); NULL for an instance-wide provider, as every
provider stored before this upgrade stays. A name (and its casefolded `name_key`) is
unique within its workspace, and among the instance-wide providers: partial unique
indexes, since both stores let a plain unique index on (workspace_id, name_key) hold any
number of NULL workspace_ids with one name.
"""


def up(migrator, db):
    db.execute_sql("ALTER TABLE provider ADD COLUMN workspace_id VARCHAR(36) NULL "
                   "REFERENCES workspace (id) ON DELETE CASCADE")
    for column in ("name", "name_key"):
        db.execute_sql(f"DROP INDEX IF EXISTS provider_{column}")
        db.execute_sql(f"CREATE UNIQUE INDEX provider_instance_{column} ON provider ({column}) "
                       "WHERE workspace_id IS NULL")
        db.execute_sql(f"CREATE UNIQUE INDEX provider_workspace_{column} ON provider (workspace_id, {column}) "
                       "WHERE workspace_id IS NOT NULL")


def down(migrator, db):
    db.execute_sql("UPDATE system_node SET provider_id = NULL WHERE provider_id IN "
                   "(SELECT id FROM provider WHERE workspace_id IS NOT NULL)")
    db.execute_sql("DELETE FROM worker WHERE provider_id IN (SELECT id FROM provider WHERE workspace_id IS NOT NULL)")
    db.execute_sql("DELETE FROM provider WHERE workspace_id IS NOT NULL")
    for column in ("name", "name_key"):
        db.execute_sql(f"DROP INDEX IF EXISTS provider_workspace_{column}")
        db.execute_sql(f"DROP INDEX IF EXISTS provider_instance_{column}")
    migrator.migrate(migrator.drop_column("provider", "workspace_id"))
    for column in ("name", "name_key"):
        db.execute_sql(f"CREATE UNIQUE INDEX provider_{column} ON provider ({column})")
