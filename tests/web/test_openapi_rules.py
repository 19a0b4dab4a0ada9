"""The document states the rules the services enforce, exactly, so that schemathesis finds
no valid-looking request refused (tests/e2e/test_openapi_fuzz.py): each pattern here is
checked against the service that enforces it."""

from __future__ import annotations

import re
import unicodedata

import pytest

from orchestra.errors import ValidationError
from orchestra.services import auth, charset, providers
from orchestra.services.paging import encode_cursor
from orchestra.web.validation import STR_MAX
from tests.web.test_openapi import body_schema

DOC = "/api/v1/docs/openapi.json"


@pytest.fixture
async def doc(client) -> dict:
    return (await client.get(DOC)).json()


def _accepted(clean, value: str) -> bool:
    try:
        clean(value)
        return True
    except ValidationError:
        return False


def test_the_control_ranges_are_unicode_cc_and_cf_of_this_python():
    expected = charset.code_ranges(lambda ch: unicodedata.category(ch) in ("Cc", "Cf"))
    assert list(charset.CONTROL_RANGES) == expected
    assert list(charset.SPACE_RANGES) == charset.code_ranges(str.isspace)


NAMES = ["x", " x ", "\u200bx", "x\U000e0001", "\ue000", "\U0008db7f", "a\u0085", "\u0085", "\x1d&C\x85",
         "é", "a\u00adb", "n" * 128, "n" * 129, " \t", "", "ﬁ" * 3, "a\u2028b", "\ufeffa"]


async def test_display_names_follow_the_service_exactly(doc):
    """Control and format characters (Cc, Cf) are refused; private-use and unassigned
    characters are letters like any other; white space is what strip() removes."""
    pattern = re.compile(body_schema(doc, "/api/v1/provider", "post")["properties"]["name"]["pattern"])
    for name in NAMES:
        assert bool(pattern.search(name)) == _accepted(providers.clean_name, name), repr(name)


USER_NAMES = ["abc", "  ab.c@d  ", "ａｂｃ", "ab", "a" * 64, "a" * 65, "abc\u00bc", "ab¹", "a b c",
              "ab\u0301", "\x85ab9\x85", "日本語", "ab\ue000", "ab\u200b"]


async def test_user_names_follow_the_service(doc):
    pattern = re.compile(body_schema(doc, "/api/v1/auth/register", "post")["properties"]["user_name"]["pattern"])
    for name in USER_NAMES:
        assert bool(pattern.search(name)) == _accepted(auth.normalize_user_name, name), repr(name)


async def test_cursors_have_a_form_per_list(doc):
    for path, kind in (("/api/v1/workflow/run", "run"), ("/api/v1/workflow/template", "template"),
                       ("/api/v1/agent/worker", "worker"), ("/api/v1/adapter/client/upload", "file")):
        [cursor] = [p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == "cursor"]
        pattern = re.compile(cursor["schema"]["pattern"])
        import datetime as dt

        made = encode_cursor(kind, dt.datetime(2026, 1, 1, 12, 0, 0, 5), "4b6b3d74-3ad6-4a20-9fc3-91fefbbda1ad")
        assert pattern.search(made), made
        assert not pattern.search("0") and not pattern.search(made.replace(kind, "other", 1))


async def test_no_rule_is_the_body_wide_string_cap(doc):
    """STR_MAX bounds every string of a body, keys included; stated per field it made
    schemathesis build 13 MB keys (413) as 'invalid' data."""
    def sizes(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in {"maxLength", "maxItems", "maxProperties"}:
                    yield key, value
                yield from sizes(value)
        elif isinstance(node, list):
            for value in node:
                yield from sizes(value)

    found = list(sizes(doc["components"]))
    assert found and all(value != STR_MAX for _, value in found)


async def test_references_are_ids_and_names_of_their_form(doc):
    worker = body_schema(doc, "/api/v1/agent/worker", "post")["properties"]
    uuid = "4b6b3d74-3ad6-4a20-9fc3-91fefbbda1ad"
    assert re.search(worker["provider_id"]["pattern"], uuid) and not re.search(worker["provider_id"]["pattern"], "")
    skill = worker["bound_skill"]
    assert not re.search(skill["pattern"], "") and re.search(skill["pattern"], "Writer")
    run = body_schema(doc, "/api/v1/workflow/run", "post")["properties"]
    assert re.search(run["files"]["items"]["pattern"], uuid) and not re.search(run["files"]["items"]["pattern"], "x")


async def test_mcp_servers_say_what_each_transport_needs(doc):
    body = body_schema(doc, "/api/v1/resource/mcp", "post")
    assert body["properties"]["transport"]["enum"] == ["streamable_http"]  # no stdio command allowed here
    assert body["else"]["required"] == ["url"]
    url = re.compile(body["else"]["properties"]["url"]["pattern"])
    assert url.search("https://mcp.example.com/mcp") and not url.search("") and not url.search("ftp://x")
    assert body["properties"]["headers"]["propertyNames"]["pattern"]
    assert not re.search(body["properties"]["env"]["additionalProperties"]["pattern"], "…abcd")


@pytest.mark.parametrize("settings_overrides", [{"mcp_stdio_commands": "mcp-server-time,uvx"}])
async def test_a_server_that_allows_stdio_commands_names_them(doc):
    body = body_schema(doc, "/api/v1/resource/mcp", "post")
    assert body["properties"]["transport"]["enum"] == ["streamable_http", "stdio"]
    command = re.compile(body["then"]["properties"]["command"]["pattern"])
    assert command.search("uvx") and command.search(" mcp-server-time ")
    assert not command.search("mcp-server-timex") and not command.search("sh")


HUMAN = {"agent": {"human": True}, "prompt": "Approve?"}
INNER = [{"id": "inner", **HUMAN}]
STEPS = [
    {"id": "a"},  # no agent (the finding)
    {"id": "a", **HUMAN},
    {"id": "a", "agent": None, "prompt": "x"},
    {"id": "a", "loop": {"steps": INNER, "until": "true", "max_iterations": 2}},
    {"id": "a", "loop": {"steps": INNER, "until": "true", "max_iterations": 2}, **HUMAN},
    {"id": "a", "foreach": {"items": "[1, 2]"}, **HUMAN},
    {"id": "a", "foreach": {"items": "[1, 2]"}, "steps": INNER},
    {"id": "a", "foreach": {"items": "[1, 2]"}, "steps": INNER, **HUMAN},
    {"id": "a", "foreach": {"items": "[1, 2]"}},
    {"id": "a", **HUMAN, "output": "1"},
    {"id": "a", **HUMAN, "steps": None},
    {"id": "a", "foreach": {"items": "[1]"}, "loop": {"steps": INNER, "until": "true", "max_iterations": 2}},
]


@pytest.mark.parametrize("step", STEPS)
async def test_the_step_kinds_are_what_the_template_check_accepts(doc, step):
    import jsonschema

    from orchestra.language.validate import check_template

    schema = {"$ref": "#/components/schemas/Step", "components": doc["components"]}
    valid = jsonschema.Draft202012Validator(schema).is_valid(step)
    assert valid == (not check_template([step]).problems), check_template([step]).problems
