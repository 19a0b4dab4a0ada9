"""Secret hosts (SPEC §15b): `secret.hosts`, the JSON list of hosts an HTTP step may send
the secret to (host names, `*.domain` wildcards, optional ports).

Secrets stored before this migration have none (NULL): no step may send them anywhere
until an administrator sets their hosts (`PUT /api/v1/resource/secret/NAME` with
`{"hosts": [...]}`, or `orchestra secret hosts NAME --host …`). The upgrade says so in a
warning naming them (docs/operations.md, "Stores and migrations").
"""

import logging

from peewee import TextField

logger = logging.getLogger("orchestra.db.migrations")


def up(migrator, db):
    migrator.migrate(migrator.add_column("secret", "hosts", TextField(null=True)))
    names = [row[0] for row in db.execute_sql("SELECT name FROM secret ORDER BY name").fetchall()]
    if names:
        shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        logger.warning(
            "%d secret(s) stored before secrets had hosts (%s) are now unusable: an HTTP step "
            "sends a secret only to one of its hosts. Set them with PUT /api/v1/resource/secret/NAME "
            '{"hosts": ["api.example.com"]} or `orchestra secret hosts NAME --host api.example.com` '
            "(docs/operations.md, \"Stores and migrations\").", len(names), shown)


def down(migrator, db):
    migrator.migrate(migrator.drop_column("secret", "hosts"))
