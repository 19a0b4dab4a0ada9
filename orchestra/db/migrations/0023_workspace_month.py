"""Teams (SPEC §16), the money part: `workspace_month`, a workspace's spend in one
calendar month (UTC), in whole pico-dollars, open reservations included — the running
total `limits.monthly_budget_usd` caps, one row per (workspace, "YYYY-MM"), deleted with
its workspace; and `workspace.monthly_budget_pusd`, that cap as a number (rounded down
to whole pico-dollars), so that a reservation's one statement compares with it. The
upgrade fills it from each workspace's stored `limits`. On PostgreSQL a change of a workspace's `limits` sends the
`orchestra_cache` hint (migration 0003's function), so every process learns at once
whether the workspace's calls must reserve.
"""

import json
from decimal import ROUND_FLOOR, Decimal

from peewee import PostgresqlDatabase

PICO = Decimal(10) ** 12

TRIGGER = (
    'CREATE TRIGGER workspace_notify AFTER INSERT OR DELETE OR UPDATE OF limits ON "workspace" '
    "FOR EACH STATEMENT EXECUTE FUNCTION orchestra_notify_cache()"
)


def up(migrator, db):
    db.execute_sql("ALTER TABLE workspace ADD COLUMN monthly_budget_pusd BIGINT NULL")
    for workspace_id, limits in db.execute_sql("SELECT id, limits FROM workspace WHERE limits IS NOT NULL").fetchall():
        amount = (json.loads(limits) or {}).get("monthly_budget_usd")
        if amount is not None:
            pico = int((Decimal(amount) * PICO).to_integral_value(ROUND_FLOOR))
            db.execute_sql(f"UPDATE workspace SET monthly_budget_pusd = {db.param} WHERE id = {db.param}",
                           (pico, workspace_id))
    db.execute_sql(
        "CREATE TABLE workspace_month ("
        " workspace_id VARCHAR(36) NOT NULL REFERENCES workspace (id) ON DELETE CASCADE,"
        " month VARCHAR(7) NOT NULL,"
        " spent_pusd BIGINT NOT NULL DEFAULT 0,"
        " PRIMARY KEY (workspace_id, month))")
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(TRIGGER)


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('DROP TRIGGER IF EXISTS workspace_notify ON "workspace"')
    db.execute_sql("DROP TABLE IF EXISTS workspace_month")
    migrator.migrate(migrator.drop_column("workspace", "monthly_budget_pusd"))
