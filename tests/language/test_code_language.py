"""Code steps at save (SPEC §17): `code` is closed ({source} only, a string of at most
65,536 bytes), a code step takes no agent, prompt, tools or default, a syntax error names
`steps.N.code.source` (inner: `steps.N.steps.M.code.source`) with "line L, column C",
and what reaches for the host or imports past json, math, datetime and re is refused."""

from __future__ import annotations

import pytest

from orchestra.language.validate import check_template


def code(source, sid="c", **extra):
    return {"id": sid, "code": {"source": source}, **extra}


def problems(steps):
    return [(p["field"], p["problem"]) for p in check_template(steps).problems]


def test_a_code_step_is_stored_as_given_with_its_policies():
    checked = check_template([
        {"id": "a", "http": {"method": "GET", "url": "https://example.com"}},
        code("import json, math, datetime, re\nfrom datetime import date\nsteps['a']['output']", "c",
             depends_on=["a"], when="input != ''", retry={"max_attempts": 2}, on_error="continue",
             timeout_seconds=5, output_schema={"type": "object"}),
        {"id": "f", "foreach": {"items": "input"}, "code": {"source": "item * index"}},
    ])
    assert checked.problems == []
    assert checked.steps[1] == {
        "id": "c", "depends_on": ["a"], "when": "input != ''", "retry": {"max_attempts": 2, "backoff_seconds": 0},
        "on_error": "continue", "timeout_seconds": 5, "output_schema": {"type": "object"},
        "code": {"source": "import json, math, datetime, re\nfrom datetime import date\nsteps['a']['output']"}}
    assert checked.steps[2]["code"] == {"source": "item * index"} and "foreach" in checked.steps[2]


def test_code_is_closed_and_its_source_required_and_bounded():
    assert problems([{"id": "c", "code": {"source": "1", "language": "js"}}]) == [
        ("steps.0.code.language", "Extra inputs are not permitted")]
    assert problems([{"id": "c", "code": {}}]) == [("steps.0.code.source", "Field required")]
    assert problems([{"id": "c", "code": {"source": 5}}])[0][0] == "steps.0.code.source"
    assert problems([code("x = 'é'\n" + "#" * 65_530)]) == [
        ("steps.0.code.source", "is 65539 bytes; a code step's source may be at most 65,536 bytes")]
    assert problems([code("x = 1\n" + "#" * (65_536 - 6))]) == []
    assert problems([code("   \n")]) == [("steps.0.code.source", "must not be blank")]


@pytest.mark.parametrize("field", ["agent", "prompt", "tools", "default", "http", "workflow"])
def test_a_code_step_takes_no_agent_prompt_tools_or_default(field):
    values = {"agent": {"human": True}, "prompt": "hi", "tools": {"on_tool_error": "fail"}, "default": 1,
              "http": {"method": "GET", "url": "https://example.com"},
              "workflow": {"template": "x", "input": "input"}}
    assert problems([code("1", **{field: values[field]})]) == [(f"steps.0.{field}", "is not a field of a code step")]


def test_a_syntax_error_names_the_source_with_line_and_column():
    assert problems([code("total = 0\nfor x in input:\n    total += (x\n")]) == [
        ("steps.0.code.source", "line 3, column 14: '(' was never closed")]
    inner = [{"id": "f", "foreach": {"items": "input"}, "steps": [
        {"id": "ok", "code": {"source": "item"}}, {"id": "bad", "code": {"source": "1 +"}}]}]
    assert problems(inner) == [("steps.0.steps.1.code.source", "line 1, column 4: invalid syntax")]


@pytest.mark.parametrize("source, problem", [
    ("import os", "line 1, column 1: imports os; a code step may import only json, math, datetime, re"),
    ("import json\nimport subprocess", "line 2, column 1: imports subprocess; a code step may import only "
     "json, math, datetime, re"),
    ("from os import path", "line 1, column 1: imports from os; a code step may import only json, math, datetime, re"),
    ("from . import x", "line 1, column 1: imports from .; a code step may import only json, math, datetime, re"),
    ("open('/etc/passwd').read()", "line 1, column 1: open is not available in a code step"),
    ("__import__('os')", "line 1, column 1: __import__ is not available in a code step"),
    ("x = 1\neval('1')", "line 2, column 1: eval is not available in a code step"),
    ("exec('x = 1')", "line 1, column 1: exec is not available in a code step"),
    ("().__class__.__mro__", "line 1, column 1: the attribute __mro__ is not available in a code step"),
    ("getattr(input, 'x')", "line 1, column 1: getattr is not available in a code step"),
    ("input()", "line 1, column 1: input is the run's input, not a function"),
])
def test_what_reaches_for_the_host_is_refused_at_save(source, problem):
    assert problem in [p for _f, p in problems([code(source)])]


def test_what_steps_a_source_reads_is_its_literal_ids_or_any():
    from orchestra.language.code import step_reads

    assert step_reads("steps['a']['output'] + steps[\"b\"]['output']") == {"a", "b"}
    assert step_reads("x = 1\nx") == frozenset()
    assert step_reads("name = 'a'\nsteps[name]") is None
    assert step_reads("[s for s in steps]") is None
    assert step_reads("steps.get('a')") is None
