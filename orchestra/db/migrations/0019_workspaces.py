"""Teams (SPEC §16), the part of workspaces and their members:

- `workspace`: a team's or a user's own space. A personal one has `personal_user_id`
  (unique; deleted with its user); a team one has none.
- `workspace_member`: a user's role in a workspace (`owner`, `admin`, `editor`,
  `runner`, `viewer`), unique per (workspace, user).
- `workspace_id` on templates, runs, workers, schedules and hooks: the workspace the
  resource belongs to (deleted with it).

The upgrade gives every existing user a personal workspace (named after the user, the
user its owner) and puts each user's templates, runs, workers, schedules and hooks in
it: nothing is lost, and every resource keeps its owner.

Frozen copies of the models as they are at this migration.
"""

import datetime as dt
import json
import uuid

from peewee import BooleanField, CharField, DateTimeField, Model, TextField


def utcnow():
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def new_id():
    return str(uuid.uuid4())


class JSONField(TextField):

    def db_value(self, value):
        return None if value is None else json.dumps(value, separators=(",", ":"))

    def python_value(self, value):
        return None if value is None else json.loads(value)


class Workspace(Model):
    id = CharField(primary_key=True, max_length=36, default=new_id)
    name = CharField(max_length=128)
    personal = BooleanField(default=False)
    limits = JSONField(null=True)
    created_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "workspace"


#: The tables whose rows belong to a workspace, and the column naming their owner.
SCOPED = (
    ("workflow_template", "owner_id"),
    ("workflow_run", "owner_id"),
    ("worker", "owner_id"),
    ("workflow_schedule", "owner_id"),
    ("webhook_hook", "owner_id"),
)


def up(migrator, db):
    with db.bind_ctx([Workspace]):
        db.create_tables([Workspace])
    db.execute_sql('ALTER TABLE workspace ADD COLUMN personal_user_id VARCHAR(36) NULL '
                   'REFERENCES "user" (id) ON DELETE CASCADE')
    db.execute_sql("CREATE UNIQUE INDEX workspace_personal_user_id ON workspace (personal_user_id)")
    db.execute_sql(
        "CREATE TABLE workspace_member ("
        " workspace_id VARCHAR(36) NOT NULL REFERENCES workspace (id) ON DELETE CASCADE,"
        ' user_id VARCHAR(36) NOT NULL REFERENCES "user" (id) ON DELETE CASCADE,'
        " role VARCHAR(16) NOT NULL,"
        " created_at TIMESTAMP NOT NULL,"
        " PRIMARY KEY (workspace_id, user_id))")
    db.execute_sql("CREATE INDEX workspace_member_user_id ON workspace_member (user_id)")
    for table, _owner in SCOPED:
        db.execute_sql(f"ALTER TABLE {table} ADD COLUMN workspace_id VARCHAR(36) NULL "
                       "REFERENCES workspace (id) ON DELETE CASCADE")
        db.execute_sql(f"CREATE INDEX {table}_workspace_id ON {table} (workspace_id)")
    _personal_workspaces(db)


def _personal_workspaces(db):
    """Every existing user's personal workspace, and their resources in it."""
    param = db.param
    users = db.execute_sql('SELECT id, user_name FROM "user"').fetchall()
    now = utcnow()
    for user_id, user_name in users:
        workspace_id = new_id()
        db.execute_sql(
            "INSERT INTO workspace (id, name, personal, limits, created_at, personal_user_id) "
            f"VALUES ({param}, {param}, {param}, NULL, {param}, {param})",
            (workspace_id, user_name, True, now, user_id))
        db.execute_sql(
            "INSERT INTO workspace_member (workspace_id, user_id, role, created_at) "
            f"VALUES ({param}, {param}, 'owner', {param})", (workspace_id, user_id, now))
    for table, owner in SCOPED:
        db.execute_sql(
            f"UPDATE {table} SET workspace_id = (SELECT w.id FROM workspace w "
            f"WHERE w.personal_user_id = {table}.{owner}) WHERE workspace_id IS NULL")


def down(migrator, db):
    for table, _owner in SCOPED:
        db.execute_sql(f"DROP INDEX IF EXISTS {table}_workspace_id")
        migrator.migrate(migrator.drop_column(table, "workspace_id"))
    db.execute_sql("DROP TABLE IF EXISTS workspace_member")
    db.execute_sql("DROP TABLE IF EXISTS workspace")
