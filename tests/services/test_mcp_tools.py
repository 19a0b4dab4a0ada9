"""The tool side of orchestra's MCP server (services/mcp_tools.py): names, schemas, the
input a call's arguments stand for, and the answer a run's output becomes."""

from __future__ import annotations

import pytest

from orchestra.errors import ValidationError
from orchestra.services.mcp_tools import TEXT_INPUT_SCHEMA, Tool, _unique, output_parts, tool_name


def tool(input_schema=None, output_schema=None) -> Tool:
    return Tool("t", "id", "t", "d", input_schema, output_schema)


def test_names_are_reduced_to_the_allowed_characters_and_64_long():
    assert tool_name("Triage ticket!") == "Triage_ticket"
    assert tool_name("résumé / review-2") == "r_sum_review-2"
    assert tool_name("!!!") == "template"
    assert len(tool_name("x" * 200)) == 64


def test_clashing_names_get_a_suffix_within_64_characters():
    taken: set[str] = set()
    assert [_unique(n, taken) for n in ["a", "a", "a"]] == ["a", "a_2", "a_3"]
    long = "y" * 64
    second = _unique(long, {long})
    assert second.endswith("_2") and len(second) == 64


def test_input_schemas_and_the_run_input_of_arguments():
    assert tool().tool_input_schema == TEXT_INPUT_SCHEMA
    assert tool().run_input({"input": "hi"}) == "hi" and tool().run_input(None) == ""
    with pytest.raises(ValidationError):
        tool().run_input({"input": 3})
    obj = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert tool(obj).tool_input_schema == obj and tool(obj).run_input({"a": 1}) == {"a": 1}
    arr = {"type": "array"}
    assert tool(arr).tool_input_schema == {"type": "object", "properties": {"input": arr}, "required": ["input"]}
    assert tool(arr).run_input({"input": [1]}) == [1]
    with pytest.raises(ValidationError):
        tool(arr).run_input({})


def test_output_schemas_are_objects_and_outputs_become_text_and_structure():
    assert tool().tool_output_schema is None
    assert tool(output_schema={"type": "integer"}).tool_output_schema == {
        "type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}
    assert output_parts("plain") == ("plain", None)
    assert output_parts({"a": 1}) == ('{"a": 1}', {"a": 1})
    assert output_parts([1, 2]) == ("[1, 2]", {"result": [1, 2]})
    assert output_parts(None) == ("null", {"result": None})
