"""Reuse keys (SPEC §13): `run_step.reuse_key`, the digest of what an agent or human call
ran with (its definition, rendered prompt, attached files and the worker's or node's
configuration), stored with its output so a fork can tell at run time whether a call of
its own would be the same call (engine/reuse.py). Rows stored before have none: a fork
compares them by definition and rendered prompt only.
"""

from peewee import CharField


def up(migrator, db):
    migrator.migrate(migrator.add_column("run_step", "reuse_key", CharField(max_length=64, null=True)))


def down(migrator, db):
    migrator.migrate(migrator.drop_column("run_step", "reuse_key"))
