"""A refresh family remembers when its access tokens were stopped (`access_revoked_at`):
set when a used refresh token is presented again and on a password change, so that an
access token naming that family (`fam` claim) is refused at once (SPEC §2, §15). On
PostgreSQL a trigger signals every revocation on the `orchestra_cache` channel
(payload `refresh_token`), so every process drops its copy of the revoked families.
"""

from peewee import DateTimeField, PostgresqlDatabase

TRIGGER = (
    'CREATE TRIGGER refresh_token_notify AFTER UPDATE OF access_revoked_at ON "refresh_token" '
    "FOR EACH STATEMENT EXECUTE FUNCTION orchestra_notify_cache()"
)


def up(migrator, db):
    migrator.migrate(
        migrator.add_column(
            "refresh_token", "access_revoked_at", DateTimeField(null=True, index=True)
        ),
    )
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(TRIGGER)


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql('DROP TRIGGER IF EXISTS refresh_token_notify ON "refresh_token"')
    migrator.migrate(migrator.drop_column("refresh_token", "access_revoked_at"))
