"""`template check` runs code steps on examples (SPEC §17, services/code_check.py): in
dependency order, earlier code steps' real outputs feeding later ones, a foreach of code
on its first example item; a save never runs code."""

from __future__ import annotations

from orchestra.services import auth, templates

SCHEMA = {"type": "object", "required": ["rows"], "properties": {"rows": {"type": "array", "items": {
    "type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": 3}}}}}}


async def test_code_steps_run_on_examples_in_dependency_order(core):
    user = await auth.register(core, user_name="alice", password="password-123")
    steps = [
        {"id": "later", "depends_on": ["first"], "code": {"source": "steps['first']['output'] * 2"}},
        {"id": "first", "code": {"source": "sum(r['n'] for r in input['rows'])"}},
        {"id": "each", "foreach": {"items": "input.rows"}, "code": {"source": "10 // (item['n'] - 3)"}},
        {"id": "after", "depends_on": ["later"], "code": {"source": "'x' + steps['later']['output']"}},
    ]
    checked = await templates.check_template(core, owner_id=user.id, steps=steps,
                                             options={"input_schema": SCHEMA}, run_code=True)
    assert checked.problems == [
        {"field": "steps.2.code.source", "problem": 'on example inputs (input: {"rows": [{"n": 3}]}, '
         'item: {"n": 3}): ZeroDivisionError: division by zero (line 1)'},
        {"field": "steps.3.code.source", "problem": 'on example inputs (input: {"rows": [{"n": 3}]}): '
         'TypeError: can only concatenate str (not "int") to str (line 1)'},
    ]
    saved = await templates.check_template(core, owner_id=user.id, steps=steps, options={"input_schema": SCHEMA})
    assert saved.problems == []  # what a save checks: nothing runs
