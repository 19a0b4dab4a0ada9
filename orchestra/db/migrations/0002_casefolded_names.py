"""Names unique without regard to case: a `name_key` column (NFKC, casefolded) with a
unique index on providers and skills, and per owner on workers and templates.

Before this, uniqueness was a check-then-insert, so concurrent creates could store
"Same" and "same" twice (and workers had no check at all). An existing store may hold
such duplicates: the oldest row (by `created_at`, then id) keeps its name, and each later
one is renamed with the first free suffix " (2)", " (3)", … (cut to fit 128 characters).
A renamed skill's bound workers follow it. Each rename is logged as a warning.
Self-contained on purpose (no import of orchestra.db.models): later model changes
must never change what this migration does.
"""

import logging
import unicodedata

from peewee import CharField

logger = logging.getLogger("orchestra.db.migrations")

NAME_MAX = 128
# (table, the column scoping uniqueness or None for store-wide)
TABLES = (
    ("provider", None),
    ("skill", None),
    ("worker", "owner_id"),
    ("workflow_template", "owner_id"),
)


def name_key(name):
    return unicodedata.normalize("NFKC", name).casefold()


def _free_name(name, scope, taken):
    """`name (n)` for the smallest n >= 2 whose key is free in `scope`."""
    n = 2
    while True:
        suffix = f" ({n})"
        candidate = name[: NAME_MAX - len(suffix)] + suffix
        if (scope, name_key(candidate)) not in taken:
            return candidate
        n += 1


def _fill_keys(db, table, scope_column):
    scope_sql = f', "{scope_column}"' if scope_column else ""
    rows = db.execute_sql(
        f'SELECT "id", "name"{scope_sql} FROM "{table}" ORDER BY "created_at", "id"'
    ).fetchall()
    scope_of = (lambda row: row[2]) if scope_column else (lambda row: None)
    taken = {(scope_of(row), name_key(row[1])) for row in rows}
    seen = set()
    for row in rows:
        row_id, name, scope = row[0], row[1], scope_of(row)
        key = name_key(name)
        if (scope, key) in seen:
            new_name = _free_name(name, scope, taken)
            key = name_key(new_name)
            taken.add((scope, key))
            logger.warning("%s %s: duplicate name %r renamed to %r", table, row_id, name, new_name)
            db.execute_sql(f'UPDATE "{table}" SET "name" = %s WHERE "id" = %s'.replace(
                "%s", db.param), (new_name, row_id))
            if table == "skill":  # workers name the skill they are bound to
                db.execute_sql('UPDATE "worker" SET "bound_skill" = %s WHERE "bound_skill" = %s'.replace(
                    "%s", db.param), (new_name, name))
        seen.add((scope, key))
        db.execute_sql(f'UPDATE "{table}" SET "name_key" = %s WHERE "id" = %s'.replace(
            "%s", db.param), (key, row_id))


def up(migrator, db):
    for table, scope_column in TABLES:
        migrator.migrate(migrator.add_column(table, "name_key", CharField(max_length=512, null=True)))
        _fill_keys(db, table, scope_column)
        columns = (scope_column, "name_key") if scope_column else ("name_key",)
        migrator.migrate(migrator.add_index(table, columns, unique=True))


def down(migrator, db):
    for table, scope_column in reversed(TABLES):
        columns = (scope_column, "name_key") if scope_column else ("name_key",)
        migrator.migrate(migrator.drop_index(table, "_".join((table, *columns))))
        migrator.migrate(migrator.drop_column(table, "name_key"))
