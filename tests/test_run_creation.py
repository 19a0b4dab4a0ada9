"""One way to create runs: exactly one place in orchestra/ inserts `workflow_run` rows —
`create_runs` in orchestra/engine/store/creation.py, which every start goes through
(`RunStore.create`). Read with `ast` from the source of every module, so a second insert
anywhere fails here, whatever form it takes:

- a writing class method of the model (`WorkflowRun.insert`, `.insert_many`, `.create`,
  `.acreate`, `.get_or_create`, `.replace`, …), under any name it is imported as;
- a row built (`WorkflowRun(...)`, which `.save()` would insert);
- the model handed around as a value (`for model, rows in ((WorkflowRun, …), …)`, `m =
  WorkflowRun`): whoever receives it may insert; the model read as `WorkflowRun.field`, in
  annotations, compared with `is`, joined or referred to by a foreign key are not places;
- SQL text that inserts into `workflow_run`.

A place is the function (or module) such a thing is in.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "orchestra"
MODEL = "WorkflowRun"
WRITES = {"insert", "insert_many", "insert_from", "create", "acreate", "get_or_create",
          "aget_or_create", "bulk_create", "replace", "replace_many", "save"}
#: Calls that take the model to read it, never to insert into it.
READERS = {"ForeignKeyField", "join", "join_from", "switch", "isinstance"}
SQL = re.compile(r"\binsert\s+(or\s+\w+\s+)?into\s+[\"'`]?workflow_run[\"'`]?(\s|\()", re.IGNORECASE)
THE_PLACE = ("orchestra/engine/store/creation.py", "create_runs")


def _names(tree: ast.AST) -> set[str]:
    """The names the model is known by in a module (its imports, `as` included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found |= {alias.asname or alias.name for alias in node.names if alias.name == MODEL}
    return found


class Scan:
    """One module's source, read for the places that insert run rows."""

    def __init__(self, source: str, where: str) -> None:
        self.tree = ast.parse(source)
        self.where = where
        self.names = _names(self.tree) | {MODEL}
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node

    def is_model(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in self.names) or (
            isinstance(node, ast.Attribute) and node.attr == MODEL)

    def in_annotation(self, node: ast.AST) -> bool:
        while node in self.parents:
            parent = self.parents[node]
            if getattr(parent, "annotation", None) is node or getattr(parent, "returns", None) is node:
                return True
            node = parent
        return False

    def place(self, node: ast.AST) -> tuple[str, str]:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self.where, node.name
        return self.where, "<module>"

    def inserts(self, node: ast.AST) -> bool:
        """Whether `node` (the model, or SQL text) inserts or may insert a run row."""
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and bool(SQL.search(node.value))
        if not self.is_model(node) or self.in_annotation(node):
            return False
        parent = self.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            # `WorkflowRun.x`: a write when x is a writing method that is called
            return parent.attr in WRITES and isinstance(self.parents.get(parent), ast.Call)
        if isinstance(parent, ast.Call) and parent.func is node:
            return True  # a row built
        if isinstance(parent, ast.Call) and node in parent.args:
            func = parent.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in READERS:
                return False  # a foreign key to it, a join with it
        # `x is WorkflowRun` reads; anything else hands the model on: its receiver may insert
        return not isinstance(parent, ast.Compare)

    def places(self) -> set[tuple[str, str]]:
        return {self.place(node) for node in ast.walk(self.tree) if self.inserts(node)}


def inserting_places(source: str, where: str) -> set[tuple[str, str]]:
    """(module, function) of every place in `source` that inserts, or may insert, a run row."""
    return Scan(source, where).places()


def every_place() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent).as_posix()
        if where.startswith("orchestra/db/migrations/"):
            continue  # a migration's own frozen models
        found |= inserting_places(path.read_text(encoding="utf-8"), where)
    return found


def test_runs_are_created_in_exactly_one_place():
    assert every_place() == {THE_PLACE}, (
        "workflow_run rows are inserted only by create_runs (engine/store/creation.py): start a "
        "run through RunStore.create with a NewRun instead")


def test_the_count_sees_every_form_of_insert():
    examples = {
        "async def a(db):\n    await db.aexecute(WorkflowRun.insert(trace_id='x'))\n": "a",
        "async def b():\n    await WorkflowRun.acreate(owner='u')\n": "b",
        "from orchestra.db.models import WorkflowRun as Run\n"
        "def c(rows):\n    return Run.insert_many(rows)\n": "c",
        "from orchestra.db import models\ndef d():\n    return models.WorkflowRun.create(owner='u')\n": "d",
        "def e(run):\n    WorkflowRun(**run).save(force_insert=True)\n": "e",
        "async def f(db, runs):\n    for model, rows in ((WorkflowRun, runs),):\n"
        "        await db.aexecute(model.insert_many(rows))\n": "f",
        "def g(db):\n    db.execute_sql('INSERT INTO \"workflow_run\" (trace_id) VALUES (?)', ['x'])\n": "g",
    }
    for source, function in examples.items():
        assert inserting_places(source, "m.py") == {("m.py", function)}, source
    reads = ("from typing import Any\n"
             "def r(run: WorkflowRun, x: Any) -> list[WorkflowRun]:\n"
             "    q = WorkflowRun.select().where(WorkflowRun.trace_id == 'x')\n"
             "    WorkflowRun.update(status='s')\n"
             "    q.join(WorkflowRun, on=True)\n"
             "    return x.rel_model is WorkflowRun\n")
    assert inserting_places(reads, "m.py") == set()
