"""Template versions and forks (SPEC §13).

- `template_version`: one immutable row per template save, numbered 1, 2, … per
  template (unique), holding that save's content once (name, description, steps, spec)
  and its `step_count`, so the version list reads no content. Deleted with its template.
- `workflow_template.version`: the latest version's number; a save takes the next one
  with an UPDATE of this row, so concurrent saves queue on its lock and get consecutive
  numbers.
- `workflow_run.template_version`: the version a run ran; `forked_from`: the run a fork
  started from, its `from_step` and the steps whose outputs it set.

Every template that exists gets its current content as version 1.

A frozen copy of the table as it was at this migration, independent of
orchestra.db.models so later model changes never alter it.
"""

import datetime as dt
import json

from peewee import (
    AutoField,
    CharField,
    DateTimeField,
    ForeignKeyField,
    IntegerField,
    Model,
    TextField,
)


def utcnow():
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class _JSON(TextField):  # the column type of models.JSONField
    pass


class _Template(Model):
    id = CharField(primary_key=True, max_length=36)

    class Meta:
        table_name = "workflow_template"


class _User(Model):
    id = CharField(primary_key=True, max_length=36)

    class Meta:
        table_name = "user"


class TemplateVersion(Model):
    id = AutoField()
    template = ForeignKeyField(_Template, on_delete="CASCADE", index=False)
    version = IntegerField()
    name = CharField(max_length=128)
    description = TextField(default="")
    steps = _JSON()
    spec = _JSON(null=True)
    step_count = IntegerField(default=0)
    author = ForeignKeyField(_User, null=True, on_delete="SET NULL")
    created_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "template_version"
        indexes = ((("template", "version"), True),)


def _count(steps):
    """Every step with an id, inner ones of foreach and loop included."""
    total = 0
    for step in steps or []:
        if not isinstance(step, dict):
            continue
        total += 1
        inner = (step.get("loop") or {}).get("steps") if isinstance(step.get("loop"), dict) else step.get("steps")
        if isinstance(inner, list):
            total += _count(inner)
    return total


def up(migrator, db):
    migrator.migrate(
        migrator.add_column("workflow_template", "version", IntegerField(default=0)),
        migrator.add_column("workflow_run", "template_version", IntegerField(null=True)),
        migrator.add_column("workflow_run", "forked_from", _JSON(null=True)),
    )
    with db.bind_ctx([TemplateVersion, _Template, _User]):
        db.create_tables([TemplateVersion])
        rows = db.execute_sql(
            "SELECT id, name, description, steps, spec, owner_id, updated_at FROM workflow_template"
        ).fetchall()
        for tid, name, description, steps, spec, owner_id, updated_at in rows:
            TemplateVersion.insert(
                template=tid, version=1, name=name, description=description or "", steps=steps,
                spec=spec, step_count=_count(json.loads(steps) if steps else []), author=owner_id,
                created_at=updated_at or utcnow(),
            ).execute()
    db.execute_sql("UPDATE workflow_template SET version = 1")


def down(migrator, db):
    with db.bind_ctx([TemplateVersion, _Template, _User]):
        db.drop_tables([TemplateVersion])
    migrator.migrate(
        migrator.drop_column("workflow_run", "forked_from"),
        migrator.drop_column("workflow_run", "template_version"),
        migrator.drop_column("workflow_template", "version"),
    )
