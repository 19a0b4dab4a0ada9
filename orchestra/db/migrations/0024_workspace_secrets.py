"""Teams (SPEC §16), the secrets part: `secret.workspace_id`, the workspace a secret
belongs to (deleted with it); NULL for an instance-wide secret, as every secret stored
before this upgrade stays. A name is unique within its workspace, and among the
instance-wide secrets: two partial unique indexes, since both stores let a plain unique
index on (workspace_id, name) hold any number of NULL workspace_ids with one name.
"""


def up(migrator, db):
    db.execute_sql("ALTER TABLE secret ADD COLUMN workspace_id VARCHAR(36) NULL "
                   "REFERENCES workspace (id) ON DELETE CASCADE")
    db.execute_sql("DROP INDEX IF EXISTS secret_name")
    db.execute_sql("CREATE UNIQUE INDEX secret_instance_name ON secret (name) WHERE workspace_id IS NULL")
    db.execute_sql("CREATE UNIQUE INDEX secret_workspace_name ON secret (workspace_id, name) "
                   "WHERE workspace_id IS NOT NULL")


def down(migrator, db):
    db.execute_sql("DELETE FROM secret WHERE workspace_id IS NOT NULL")
    db.execute_sql("DROP INDEX IF EXISTS secret_workspace_name")
    db.execute_sql("DROP INDEX IF EXISTS secret_instance_name")
    migrator.migrate(migrator.drop_column("secret", "workspace_id"))
    db.execute_sql("CREATE UNIQUE INDEX secret_name ON secret (name)")
