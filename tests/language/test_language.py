"""The workflow language without a store: expressions, schemas, the template checks (SPEC §7)."""

from __future__ import annotations

import pytest

from orchestra.language import expressions as ex
from orchestra.language import schemas
from orchestra.language.model import NODE_NAMES
from orchestra.language.validate import check_template
from orchestra.services.node_specs import NODE_SPECS

STEPS = {
    "review": {"output": {"approved": True, "notes": ["a", "b"]}, "status": "succeeded"},
    "fetch-data": {"output": "raw text", "status": "succeeded"},
    "skipped": {"output": None, "status": "skipped"},
}


def scope(input="hello"):
    return ex.Scope({"input": input, "steps": STEPS})


def human(sid, prompt="Go {{input}}", depends_on=(), **extra):
    return {"id": sid, "agent": {"human": True}, "prompt": prompt, "depends_on": list(depends_on), **extra}


def fields(checked):
    return {(p["field"], p["problem"]) for p in checked.problems}


def test_node_names_are_the_services_nodes():
    assert tuple(NODE_SPECS) == NODE_NAMES


async def test_expressions_read_json_field_by_field():
    s = scope({"topics": ["x", "y"], "n": 2})
    assert await s.evaluate("steps.review.output.approved == true") is True
    assert await s.evaluate("steps.review.output.notes") == ["a", "b"]
    assert await s.evaluate('steps["fetch-data"].output + "!"') == "raw text!"
    assert await s.evaluate("size(input.topics) * input.n") == 4
    assert await s.evaluate("steps.skipped.output == null && steps.skipped.status == 'skipped'") is True
    assert await s.evaluate('{"k": [1, 2.5]}') == {"k": [1, 2.5]}
    assert await s.evaluate('timestamp("2020-01-01T00:00:00Z")') == "2020-01-01T00:00:00Z"


async def test_prompts_insert_strings_as_they_are_and_the_rest_as_compact_json():
    text = await ex.render(
        "{{input}} | {{steps.fetch-data.output}} | {{ steps.review.output }} | {{ 1 + 2 }} | "
        "{{ steps.review.output.notes[1] }}",
        scope(),
    )
    assert text == 'hello | raw text | {"approved":true,"notes":["a","b"]} | 3 | b'
    assert await ex.render("{{input}}", scope({"a": 1})) == '{"a":1}'
    assert await ex.render("no placeholders", scope()) == "no placeholders"


@pytest.mark.parametrize(
    "source, words",
    [
        ("steps.review.output.missing", "no such key"),
        ("input + 1", "string + int"),
        ("steps.nobody.output", "no such key"),
    ],
)
async def test_runtime_failures_name_the_expression(source, words):
    with pytest.raises(ex.ExpressionError) as caught:
        await scope().evaluate(source)
    assert f"expression `{source}`" in str(caught.value) and words in str(caught.value)


async def test_conditions_must_be_booleans():
    with pytest.raises(ex.ExpressionError, match="must give true or false"):
        await scope().truth("input")
    assert await scope().truth("steps.review.output.approved") is True


def test_compile_is_cached_and_reports_references():
    first = ex.compile_expression('steps.a.output.x && steps["b-c"].status == "steps.zz" && [1].exists(q, q > 0)')
    assert ex.compile_expression(first.source) is first
    assert first.step_refs == ("a", "b-c")  # not the one inside a string literal
    assert first.variables == {"steps"}  # q is bound by the macro


def test_expression_limits_and_parse_errors():
    compiled, problems = ex.check("x" * 1001)
    assert compiled is None and "limit is 1000" in problems[0]
    compiled, problems = ex.check("steps.")
    assert compiled is None and problems[0].startswith("expression `steps.`: does not parse")
    _, problems = ex.check("colour == 1")
    assert "unknown variable 'colour'" in problems[0]


def test_schemas_are_checked_and_values_validated_with_paths():
    good = {"type": "object", "properties": {"topics": {"type": "array", "items": {"type": "string"}}},
            "required": ["topics"]}
    assert schemas.check_schema(good) == []
    assert schemas.violations({"topics": ["a", "b", 3]}, good, root="input") == [
        {"field": "input.topics.2", "problem": '3 is not of type "string"'}
    ]
    assert schemas.violations({}, good, root="input")[0]["field"] == "input"
    assert "remote $ref" in schemas.check_schema({"$ref": "https://example.com/s.json"})[0][1]
    assert "does not resolve" in schemas.check_schema({"$ref": "#/$defs/none"})[0][1]
    assert schemas.check_schema({"type": "nope"})[0][0] == "type"
    huge = {"type": "object", "description": "x" * (64 * 1024)}
    assert "64 KiB" in schemas.check_schema(huge)[0][1]


def test_v1_templates_pass_unchanged():
    steps = [human("a-1"), human("b", "{{steps.a-1.output}} and {{ input }}", ["a-1"])]
    checked = check_template(steps)
    assert checked.problems == [] and checked.steps == steps and checked.options == {}


def test_language_fields_are_kept_and_checked():
    schema = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}
    steps = [
        human("review", output_schema=schema, timeout_seconds=60, default={"approved": False}),
        human("ship", "Ship {{ steps.review.output }}", ["review"],
              when="steps.review.output.approved", retry={"max_attempts": 3, "backoff_seconds": 1},
              on_error="continue"),
    ]
    checked = check_template(steps, {"input_schema": {"type": "string"}, "limits": {"max_steps": 5},
                                     "output": "steps.ship.output"})
    assert checked.problems == []
    assert checked.steps[1]["when"] == "steps.review.output.approved"
    assert checked.steps[1]["retry"] == {"max_attempts": 3, "backoff_seconds": 1}
    assert checked.options == {"input_schema": {"type": "string"}, "limits": {"max_steps": 5},
                               "output": "steps.ship.output"}


def test_every_language_problem_has_its_path():
    steps = [
        human("a", when="steps.b.output == 'x'"),  # b is not an ancestor
        human("b", "{{ steps.a.output.( }}", ["a"], output_schema={"$ref": "http://x/y"}),
        human("c", "{{ colour }}", ["b"], timeout_seconds=0, retry={"max_attempts": 11},
              on_error="ignore", default=1),
        {"id": "d", "agent": {"worker": "w1"}, "prompt": "p", "default": "x", "when": "1 +"},
    ]
    checked = check_template(steps, {"input_schema": {"type": 5}, "limits": {"deadline_seconds": 0},
                                     "output": "steps.zz.output"})
    found = fields(checked)
    problems_at = {f for f, _ in found}
    assert ("steps.0.when", "`steps.b.output == 'x'` needs step 'b' in depends_on (directly or transitively)") in found
    assert any(f == "steps.1.prompt" and "does not parse" in p for f, p in found)
    assert ("steps.1.output_schema.$ref",
            "remote $ref is not allowed; use '#/…' references inside the schema") in found
    assert any(f == "steps.2.prompt" and "unknown placeholder {{colour}}" in p for f, p in found)
    assert {"steps.2.timeout_seconds", "steps.2.retry.max_attempts", "steps.2.on_error"} <= problems_at
    assert any(f == "steps.3.when" and "does not parse" in p for f, p in found)
    assert ("steps.3.default", "is for human steps only") in found
    assert any(f == "input_schema.type" for f, _ in found)
    assert "limits.deadline_seconds" in problems_at
    assert ("output", "`steps.zz.output` names unknown step 'zz'") in found
    assert [(where, ref) for where, ref, _agent in checked.workers] == [("steps.3.agent.worker", "w1")]


def test_human_default_rules():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    found = fields(check_template([human("h", default=True)]))
    assert ("steps.0.default", "needs timeout_seconds (it is the output after a timeout)") in found
    found = fields(check_template([human("h", timeout_seconds=5, output_schema=schema, default={"ok": 1})]))
    assert ("steps.0.default.ok", 'does not match output_schema: 1 is not of type "boolean"') in found
    found = fields(check_template([human("h", timeout_seconds=5, default=3)]))
    assert ("steps.0.default", "must be a string (a reply) unless output_schema is set") in found


# --- run-time policies (pure) -------------------------------------------------------------

from orchestra.language import policies  # noqa: E402


async def test_skip_propagation_and_when():
    states = {"a": {"output": None, "status": "skipped"}, "b": {"output": {"ok": False}, "status": "succeeded"}}
    scope = policies.step_scope("in", states)
    assert (await policies.decide({"id": "c", "depends_on": ["a"]}, states, scope)) == policies.Decision(False, "dependencies")
    assert (await policies.decide({"id": "c", "depends_on": ["a", "b"]}, states, scope)).run is True
    assert (await policies.decide({"id": "c", "depends_on": ["b"], "when": "steps.b.output.ok"}, states, scope)) == \
        policies.Decision(False, "when")
    with pytest.raises(ex.ExpressionError, match="steps.b.output.nope"):
        await policies.decide({"id": "c", "depends_on": ["b"], "when": "steps.b.output.nope"}, states, scope)


async def test_structured_answers_are_parsed_and_validated():
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    assert (await policies.read_structured('```json\n{"ok": true}\n```', schema)) == ({"ok": True}, [])
    value, found = await policies.read_structured('{"ok": "yes"}', schema)
    assert found == [{"field": "output.ok", "problem": '"yes" is not of type "boolean"'}]
    _, found = await policies.read_structured("sure!", schema)
    assert found[0]["field"] == "output" and "is not JSON" in found[0]["problem"]
    assert 'output.ok: "yes" is not of type "boolean"' in policies.repair_prompt(
        [{"field": "output.ok", "problem": '"yes" is not of type "boolean"'}], schema)


def test_retry_delays_double_within_the_jitter():
    import random

    rng = random.Random(7)
    for attempt, base in ((1, 2.0), (2, 4.0), (3, 8.0)):
        delay = policies.retry_delay(2.0, attempt, rng=rng)
        assert base * 0.75 <= delay <= base * 1.25
    assert policies.retry_delay(0, 3) == 0.0


async def test_run_output_defaults_to_the_last_step():
    steps = [{"id": "a"}, {"id": "b"}]
    states = {"a": {"output": {"n": 2}, "status": "succeeded"}, "b": {"output": "text", "status": "succeeded"}}
    assert await policies.run_output(None, steps, states, "x") == "text"
    assert await policies.run_output({"output": "steps.a.output.n * 2"}, steps, states, "x") == 4


def test_nested_comprehensions_are_refused_on_save():
    _, problems = ex.check("input.a.map(x, input.a.map(y, x + y))")
    assert "inside another is not allowed" in problems[0]
    assert ex.check("input.a.map(x, x * 2).filter(y, y > 2)") == (ex.compile_expression(
        "input.a.map(x, x * 2).filter(y, y > 2)"), [])  # chained, not nested: linear
    assert ex.check("input.a.exists(x, x == '.map(')")[1] == []  # inside a string literal
