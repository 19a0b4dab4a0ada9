"""Built-in tools and the tool registry."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

from orchestra.engine.llm import ToolSpec
from orchestra.engine.tools import (
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    default_registry,
    validate_args,
)
from orchestra.engine.tools.calculator import calculate
from orchestra.engine.tools.current_time import now_iso

CTX = ToolContext(user_id="u1", trace_id="t1", step_id="s1")
REGISTRY = default_registry()  # the built-ins, as every Core starts with


# -- calculator -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2", "3"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("10 / 4", "2.5"),
        ("7 // 2", "3"),
        ("7 % 3", "1"),
        ("-3 ** 2", "-9"),
        ("2 ** 3 ** 2", "512"),
        ("2 ^ 10", "1024"),
        ("+5 - -5", "10"),
        ("0.1 + 0.2", "0.3"),
        ("sqrt(16) + abs(-2)", "6"),
        ("round(pi, 2)", "3.14"),
        ("min(4, 2, 8) + max(1, 9)", "11"),
        ("2 ** -1", "0.5"),
        ("12345678901234567890 * 10", "123456789012345678900"),
    ],
)
def test_calculator_arithmetic(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("1 / 0", "Division by zero"),
        ("5 % 0", "Division by zero"),
        ("__import__('os')", "Unsupported function"),
        ("(1).__class__", "Unsupported syntax"),
        ("open('x')", "Unsupported function"),
        ("x + 1", "Unknown name"),
        ("'a' * 3", "Unsupported value"),
        ("1 +", "Not a valid arithmetic expression"),
        ("", "empty"),
        ("1 < 2", "Unsupported syntax"),
        ("sqrt(-1)", "Cannot compute"),
        ("(-8) ** 0.5", "not a real number"),
        ("1e308 * 10", "too large"),
        ("1" + " + 1" * 300, "longer than"),
        ("sqrt(1, 2)", "Wrong number of arguments"),
    ],
)
def test_calculator_rejects(expression, problem):
    with pytest.raises(ToolError, match=problem):
        calculate(expression)


@pytest.mark.parametrize(
    "expression", ["9**9**9**9", "2 ** 100000", "10**1000 * 10**1000", "1.5 ** 1e10"]
)
def test_calculator_refuses_huge_results_without_computing_them(expression):
    """Refused before the power is computed (9**9**9**9 computed would never end): the
    call runs in a thread that must come back; how fast is bench_engine's business."""
    outcome: list = []

    def call() -> None:
        try:
            calculate(expression)
        except ToolError as exc:
            outcome.append(str(exc))

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the calculator computed the power"
    assert len(outcome) == 1 and "too large" in outcome[0]


@pytest.mark.asyncio
async def test_calculator_through_the_registry():
    assert await REGISTRY.run("calculator", {"expression": "6 * 7"}, CTX) == "42"


# -- current_time ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_current_time_defaults_to_utc():
    stamp = await REGISTRY.run("current_time", {}, CTX)
    parsed = datetime.fromisoformat(stamp)
    assert parsed.utcoffset() == timedelta(0)
    assert abs(parsed - datetime.now(UTC)) < timedelta(seconds=5)


@pytest.mark.asyncio
async def test_current_time_in_a_time_zone():
    stamp = await REGISTRY.run("current_time", {"timezone": "Asia/Tokyo"}, CTX)
    assert datetime.fromisoformat(stamp).utcoffset() == timedelta(hours=9)
    assert now_iso("Asia/Kolkata").endswith("+05:30")


@pytest.mark.asyncio
@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "Not A Zone"])
async def test_current_time_rejects_unknown_zones(zone):
    with pytest.raises(ToolError, match="Unknown time zone"):
        await REGISTRY.run("current_time", {"timezone": zone}, CTX)


# -- read_upload and ask_user -----------------------------------------------------------


@pytest.mark.asyncio
async def test_read_upload_and_ask_user_use_the_context():
    asked: list[str] = []

    async def read_upload(file_id: str) -> str:
        return f"contents of {file_id}"

    async def ask_user(question: str) -> str:
        asked.append(question)
        return "blue"

    ctx = ToolContext(user_id="u1", read_upload=read_upload, ask_user=ask_user)
    assert await REGISTRY.run("read_upload", {"file_id": "f-1"}, ctx) == "contents of f-1"
    assert await REGISTRY.run("ask_user", {"question": "Favourite colour?"}, ctx) == "blue"
    assert asked == ["Favourite colour?"]


@pytest.mark.asyncio
async def test_read_upload_and_ask_user_without_support_fail_cleanly():
    with pytest.raises(ToolError, match="not available"):
        await REGISTRY.run("read_upload", {"file_id": "f-1"}, CTX)
    with pytest.raises(ToolError, match="cannot ask"):
        await REGISTRY.run("ask_user", {"question": "Why?"}, CTX)


# -- registry -------------------------------------------------------------------------------


def test_catalog_shape():
    catalog = default_registry().catalog()
    assert [t["name"] for t in catalog] == ["calculator", "current_time", "read_upload", "ask_user"]
    for entry in catalog:
        assert set(entry) == {"name", "description", "parameters", "source"}
        assert entry["source"] == "builtin"
        assert entry["description"]
        assert entry["parameters"]["type"] == "object"
        assert isinstance(entry["parameters"]["properties"], dict)
    # The catalog is a copy: changing it cannot change the tools.
    catalog[0]["parameters"]["properties"].clear()
    assert REGISTRY.catalog()[0]["parameters"]["properties"]


def test_names_get_and_specs():
    assert REGISTRY.names() == ["calculator", "current_time", "read_upload", "ask_user"]
    assert REGISTRY.get("calculator") is not None and REGISTRY.get("nope") is None
    assert "ask_user" in REGISTRY
    specs = REGISTRY.specs(["current_time", "calculator"])
    assert [s.name for s in specs] == ["current_time", "calculator"]
    assert all(isinstance(s, ToolSpec) for s in specs)
    with pytest.raises(ToolError, match="Unknown tool"):
        REGISTRY.specs(["nope"])


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "args", "problem"),
    [
        ("nope", {}, "Unknown tool 'nope'"),
        ("calculator", {}, "Missing required argument"),
        ("calculator", {"expression": 42}, "must be of type string"),
        ("calculator", {"expression": "1", "extra": 1}, "Unknown argument"),
        ("calculator", {"_raw": "{broken"}, "not valid JSON"),
        ("calculator", ["1+1"], "JSON object"),
    ],
)
async def test_registry_validates_arguments(name, args, problem):
    with pytest.raises(ToolError, match=problem):
        await REGISTRY.run(name, args, CTX)


def test_validate_args_types_and_enums():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "flag": {"type": "boolean"},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "maybe": {"type": ["string", "null"]},
        },
    }
    validate_args(schema, {"n": 1, "x": 1.5, "flag": True, "mode": "a", "maybe": None})
    for bad in ({"n": True}, {"n": 1.5}, {"x": "1"}, {"flag": 1}, {"mode": "c"}, {"maybe": 3}):
        with pytest.raises(ToolError):
            validate_args(schema, bad)


@pytest.mark.asyncio
async def test_custom_tools_can_be_registered():
    class Shout(Tool):
        name = "shout"
        description = "Upper-case a text."
        parameters: ClassVar[dict[str, Any]] = {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        }

        async def run(self, args, ctx):
            return args["text"].upper()

    registry = ToolRegistry([Shout()])
    assert await registry.run("shout", {"text": "hi"}, CTX) == "HI"
    with pytest.raises(ValueError):
        registry.register(Shout())


def test_wire_names_fit_every_provider_and_lead_back():
    """MCP tools' catalog names (`server.tool`) are offered under names providers accept
    (`[A-Za-z0-9_-]{1,64}`); built-in names are offered as they are (SPEC §9)."""
    import re

    from orchestra.engine.tools import wire_name

    assert wire_name("calculator") == "calculator"
    names = ["time.get_current_time", "time_get.current_time", "a" * 60 + ".tool", "srv.naïve tool"]
    wires = [wire_name(n) for n in names]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", w) for w in wires)
    assert len(set(wires)) == len(wires)
    assert wires[0].startswith("time__get_current_time_")
    specs, back = default_registry().offer(["calculator"])
    assert [s.name for s in specs] == ["calculator"] and back == {"calculator": "calculator"}
