"""Teams (SPEC §16), API keys and subscriptions: `workspace_id` on `api_key` and
`event_subscription`, the workspace each belongs to (deleted with it).

The upgrade puts every existing key and subscription in its user's personal workspace
(migration 0019 made one for every user; a user made since has one from registration):
nothing is lost and each keeps its user.
"""

#: The tables whose rows now belong to a workspace, and the column naming their user.
SCOPED = (
    ("api_key", "user_id"),
    ("event_subscription", "owner_id"),
)


def up(migrator, db):
    for table, owner in SCOPED:
        db.execute_sql(f"ALTER TABLE {table} ADD COLUMN workspace_id VARCHAR(36) NULL "
                       "REFERENCES workspace (id) ON DELETE CASCADE")
        db.execute_sql(f"CREATE INDEX {table}_workspace_id ON {table} (workspace_id)")
        db.execute_sql(
            f"UPDATE {table} SET workspace_id = (SELECT w.id FROM workspace w "
            f"WHERE w.personal_user_id = {table}.{owner}) WHERE workspace_id IS NULL")


def down(migrator, db):
    for table, _owner in SCOPED:
        db.execute_sql(f"DROP INDEX IF EXISTS {table}_workspace_id")
        migrator.migrate(migrator.drop_column(table, "workspace_id"))
