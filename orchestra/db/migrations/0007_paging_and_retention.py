"""Indexes for keyset paging (SPEC §10) and for retention.

Each paged list is read as `WHERE <owner> ORDER BY created_at, id` from where the last
page ended, so an index on exactly that order answers a page of 20,000 runs as fast as
the first. Retention finds ended runs by `finished_at` and expired refresh tokens by
`expires_at`.
"""

INDEXES = (
    ("workflow_run", ("owner_id", "created_at", "trace_id")),
    ("workflow_run", ("created_at", "trace_id")),
    ("workflow_run", ("finished_at",)),
    ("workflow_template", ("created_at", "id")),
    ("worker", ("owner_id", "created_at", "id")),
    ("upload", ("owner_id", "created_at", "id")),
    ("refresh_token", ("expires_at",)),
)


def _name(table: str, columns: tuple[str, ...]) -> str:
    return "_".join((table, *columns))


def up(migrator, db):
    migrator.migrate(*(migrator.add_index(table, columns) for table, columns in INDEXES))


def down(migrator, db):
    migrator.migrate(*(migrator.drop_index(table, _name(table, columns)) for table, columns in INDEXES))
