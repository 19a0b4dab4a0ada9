"""Teams (SPEC §16), the MCP servers part: `mcp_server.workspace_id`, the workspace a
server belongs to (deleted with it); NULL for an instance-wide server, as every server
stored before this upgrade stays. A name (and its casefolded `name_key`) is unique within
its workspace, and among the instance-wide servers: partial unique indexes, since both
stores let a plain unique index on (workspace_id, name_key) hold any number of NULL
workspace_ids with one name. A workspace's server may have an instance-wide server's
name: its tools then stand for that name's in the workspace (services/mcp.py).
"""


def up(migrator, db):
    db.execute_sql("ALTER TABLE mcp_server ADD COLUMN workspace_id VARCHAR(36) NULL "
                   "REFERENCES workspace (id) ON DELETE CASCADE")
    for column in ("name", "name_key"):
        db.execute_sql(f"DROP INDEX IF EXISTS mcpserver_{column}")
        db.execute_sql(f"CREATE UNIQUE INDEX mcp_server_instance_{column} ON mcp_server ({column}) "
                       "WHERE workspace_id IS NULL")
        db.execute_sql(f"CREATE UNIQUE INDEX mcp_server_workspace_{column} ON mcp_server (workspace_id, {column}) "
                       "WHERE workspace_id IS NOT NULL")


def down(migrator, db):
    db.execute_sql("DELETE FROM mcp_server WHERE workspace_id IS NOT NULL")
    for column in ("name", "name_key"):
        db.execute_sql(f"DROP INDEX IF EXISTS mcp_server_workspace_{column}")
        db.execute_sql(f"DROP INDEX IF EXISTS mcp_server_instance_{column}")
    migrator.migrate(migrator.drop_column("mcp_server", "workspace_id"))
    for column in ("name", "name_key"):
        db.execute_sql(f"CREATE UNIQUE INDEX mcpserver_{column} ON mcp_server ({column})")
