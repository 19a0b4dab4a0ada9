"""The statuses of runs, steps, schedule fires and webhook deliveries, and the event
kinds, have one home, orchestra/vocabulary.py: no module compares, stores or passes one
as a bare string, nor lists them in a set, tuple, list or dictionary's keys of its own."""

from __future__ import annotations

import ast

from orchestra import vocabulary
from tests.test_architecture import modules

# A field's words: `status` is a run's, a step's or a delivery's; `outcome` a fire's (a
# model or tool call's `outcome` is a metric label, ok/error/cancelled, not one of these);
# `kind` an event's.
WORDS = {
    "status": {m.value for e in (vocabulary.RunStatus, vocabulary.StepStatus, vocabulary.DeliveryStatus) for m in e},
    "outcome": {m.value for m in vocabulary.FireOutcome},
    "kind": {m.value for m in vocabulary.EventKind},
}
FIELDS = set(WORDS)
ANY_WORD = set().union(*WORDS.values())


def _is_word(node: ast.AST, field: str | None = None) -> bool:
    words = WORDS[field] if field else ANY_WORD
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words


def _field(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr in FIELDS:
        return node.attr
    if isinstance(node, ast.Name) and node.id in FIELDS:
        return node.id
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in FIELDS):
        return node.args[0].value
    return None


def bare_words(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a status word stands as a literal: compared with a `status`/`outcome`, given
    as `status=` or `outcome=`, stored under a "status"/"outcome" key, or assigned to one."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for field in {f for side in sides if (f := _field(side))}:
                for side in sides:
                    items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                    found += [(item.lineno, item.value) for item in items if _is_word(item, field)]
        elif isinstance(node, ast.keyword) and node.arg in FIELDS and _is_word(node.value, node.arg):
            found.append((node.value.lineno, node.value.value))
        elif isinstance(node, ast.Dict):
            found += [(v.lineno, v.value) for k, v in zip(node.keys, node.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value in FIELDS and _is_word(v, k.value)]
        elif isinstance(node, ast.Assign):
            found += [(node.value.lineno, node.value.value) for target in node.targets
                      if (field := _field(target)) and _is_word(node.value, field)]
        if isinstance(node, (ast.Set, ast.Tuple, ast.List, ast.Dict)):
            # A group of words of its own (`{"succeeded", "failed"}`, a table keyed by kinds):
            # two or more, every one a word. The vocabulary's groups are the ones to use.
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            if len(items) >= 2 and all(item is not None and _is_word(item) for item in items):
                found += [(item.lineno, item.value) for item in items]
    return sorted(found)


def test_the_scan_finds_each_kind_of_bare_word():
    source = ("if run.status == 'running' or status in ('failed', 'x'): pass\n"
              "Model.update(status='pending')\n"
              "row = {'status': 'delivered', 'kind': 'failed'}\n"
              "step.status = 'skipped'\n"
              "ok = data.get('status') != 'cancelled'\n"
              "text = 'failed'\n"
              "outcome = 'cancelled'; fire(outcome='missed')\n"
              "ENDED = {'succeeded', 'failed'}; LINES = {'token': 1, 'run_failed': 2}; pair = ('failed', 'x')\n"
              "if kind == 'run_started': pass\n")
    assert bare_words(ast.parse(source)) == [(1, "failed"), (1, "running"), (2, "pending"), (3, "delivered"),
                                              (4, "skipped"), (5, "cancelled"), (7, "missed"),
                                              (8, "failed"), (8, "run_failed"), (8, "succeeded"), (8, "token"),
                                              (9, "run_started")]


def test_no_module_writes_a_status_as_a_bare_string():
    found = {}
    for name, path in modules().items():
        if name == "orchestra.vocabulary" or ".migrations." in name:
            continue  # a migration is frozen as it was written
        hits = bare_words(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            found[name] = hits
    assert not found, f"status words outside orchestra/vocabulary.py's enums: {found}"
