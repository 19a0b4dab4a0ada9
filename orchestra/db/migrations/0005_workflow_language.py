"""The workflow language (SPEC §7): what templates, runs and step rows need for data,
conditions and step policies, shaped so that loops (SPEC §8) can add instances later.

- `workflow_template.spec`, `workflow_run.spec`: the template-level options
  (`input_schema`, `limits`, `output`) as JSON; a run keeps its own copy.
- `workflow_run.input_value`: a JSON input (templates with `input_schema`; null for v1
  text input, which stays in `input`); `workflow_run.retry_of`: the run a retry reuses.
- `run_step.path`: the instance key, unique in its run (`review`; later `research[3]`,
  `improve#2.draft`), replacing the (run, step_id) unique index; `attempt` (1, 2, …),
  `reused` (copied from the run this one retries), `output_value` (a JSON output).
"""

from peewee import BooleanField, CharField, IntegerField, TextField


class _JSON(TextField):  # the column type of models.JSONField
    pass


def up(migrator, db):
    migrator.migrate(
        migrator.add_column("workflow_template", "spec", _JSON(null=True)),
        migrator.add_column("workflow_run", "spec", _JSON(null=True)),
        migrator.add_column("workflow_run", "input_value", _JSON(null=True)),
        migrator.add_column("workflow_run", "retry_of", CharField(max_length=36, null=True)),
        migrator.add_column("run_step", "path", CharField(max_length=512, default="")),
        migrator.add_column("run_step", "attempt", IntegerField(default=1)),
        migrator.add_column("run_step", "reused", BooleanField(default=False)),
        migrator.add_column("run_step", "output_value", _JSON(null=True)),
    )
    db.execute_sql("UPDATE run_step SET path = step_id")
    migrator.migrate(
        migrator.drop_index("run_step", "run_step_run_id_step_id"),
        migrator.add_index("run_step", ("run_id", "path"), True),
        migrator.add_index("run_step", ("run_id", "step_id"), False),
    )


def down(migrator, db):
    migrator.migrate(
        migrator.drop_index("run_step", "run_step_run_id_step_id"),
        migrator.drop_index("run_step", "run_step_run_id_path"),
        migrator.drop_column("run_step", "output_value"),
        migrator.drop_column("run_step", "reused"),
        migrator.drop_column("run_step", "attempt"),
        migrator.drop_column("run_step", "path"),
        migrator.drop_column("workflow_run", "retry_of"),
        migrator.drop_column("workflow_run", "input_value"),
        migrator.drop_column("workflow_run", "spec"),
        migrator.drop_column("workflow_template", "spec"),
    )
    migrator.migrate(migrator.add_index("run_step", ("run_id", "step_id"), True))
