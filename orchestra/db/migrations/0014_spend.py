"""Spend (SPEC §12): a provider's `prices` override and `limits`; a run's budget and its
spending ledger in whole pico-dollars (reservations included); each step instance's
exact cost (decimal text), provider, model and number of model calls; and the provider
slots that hold provider limits across processes (engine/provider_limits.py).
"""

from peewee import BigIntegerField, CharField, IntegerField, TextField

from orchestra.db.models import JSONField


def up(migrator, db):
    migrator.migrate(
        migrator.add_column("provider", "prices", JSONField(null=True)),
        migrator.add_column("provider", "limits", JSONField(null=True)),
        migrator.add_column("workflow_run", "budget_pusd", BigIntegerField(null=True)),
        migrator.add_column("workflow_run", "spent_pusd", BigIntegerField(null=True)),
        migrator.add_column("run_step", "cost_usd", TextField(null=True)),
        migrator.add_column("run_step", "provider_id", CharField(max_length=36, null=True)),
        migrator.add_column("run_step", "model", CharField(max_length=256, null=True)),
        migrator.add_column("run_step", "calls", IntegerField(default=0)),
    )
    db.execute_sql(
        'CREATE TABLE IF NOT EXISTS "provider_slot" ('
        '"id" VARCHAR(36) NOT NULL PRIMARY KEY, "provider_id" VARCHAR(36) NOT NULL, '
        '"run_id" VARCHAR(36) NOT NULL, "tokens" INTEGER NOT NULL, "state" VARCHAR(16) NOT NULL, '
        '"requested_at" DOUBLE PRECISION NOT NULL, "granted_at" DOUBLE PRECISION, '
        '"expires_at" DOUBLE PRECISION NOT NULL)'
    )
    db.execute_sql('CREATE INDEX IF NOT EXISTS "provider_slot_provider" '
                   'ON "provider_slot" ("provider_id", "state")')


def down(migrator, db):
    db.execute_sql('DROP TABLE IF EXISTS "provider_slot"')
    migrator.migrate(
        migrator.drop_column("run_step", "calls"),
        migrator.drop_column("run_step", "model"),
        migrator.drop_column("run_step", "provider_id"),
        migrator.drop_column("run_step", "cost_usd"),
        migrator.drop_column("workflow_run", "spent_pusd"),
        migrator.drop_column("workflow_run", "budget_pusd"),
        migrator.drop_column("provider", "limits"),
        migrator.drop_column("provider", "prices"),
    )
