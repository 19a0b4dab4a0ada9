"""The strict JSON body parser on its own: what it refuses, what it keeps, and that no
input makes it recurse or run long."""

from __future__ import annotations

import json

import pytest

from orchestra.json_body import MAX_DEPTH, MAX_NUMBER_CHARS, JSONBodyError, parse


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    "raw, phrase",
    [
        (nested(MAX_DEPTH + 1), "deeper than 64 levels"),
        (b'{"a": {"b": ' + nested(MAX_DEPTH - 1) + b"}}", "deeper than 64 levels"),
        (b"[" * 1_000_000, "deeper than 64 levels"),  # unbalanced: no pair ever closes
        (b'"' + b"{" * 200, "deeper than 64 levels"),  # an unterminated string before them
        (b'{"a": NaN}', "contains NaN"),
        (b"[Infinity]", "contains Infinity"),
        (b"[-Infinity]", "contains -Infinity"),
        (b'{"a": 1, "b": {"c": 1, "c": 2}}', 'the key "c" twice'),
        (b'{"' + b"k" * 500 + b'": 1, "' + b"k" * 500 + b'": 2}', "twice"),
        (b"[" + b"9" * (MAX_NUMBER_CHARS + 1) + b"]", f"longer than {MAX_NUMBER_CHARS} characters"),
        (b"[1e" + b"0" * 200 + b"1]", f"longer than {MAX_NUMBER_CHARS} characters"),
        (b"[1e400]", "too large to represent"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        ("{}".encode("utf-16"), "UTF-16 or UTF-32"),
        ("{}".encode("utf-16-be"), "UTF-16 or UTF-32"),
        ("{}".encode("utf-32-le"), "UTF-16 or UTF-32"),
        (b'{"a": "\xe9"}', "not valid UTF-8 (at byte 7)"),
        (b'{"a": 1,}', "not valid JSON (line 1, column 9)"),
        (b"{'a': 1}", "not valid JSON (line 1, column 2)"),
    ],
)
def test_refused_with_a_plain_sentence(raw, phrase):
    with pytest.raises(JSONBodyError) as caught:
        parse(raw)
    message = str(caught.value)
    assert phrase in message and message.startswith("The request body") and message.endswith(".")
    assert len(message) < 200  # a duplicated key is shortened, never echoed whole


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2.5, -0, 1e5, true, false, null], "b": {"c": "d"}}',
        '{"a": "[[[[{{{{ not brackets \\" \\\\ ]]"}',  # brackets and escapes inside strings
        '{"k\\\\": "\\\\\\"[", "n": ' + "1" * MAX_NUMBER_CHARS + "}",
        '["\\ud83d\\ude00", "\\u00e9", "é", "\\ud800"]',  # a lone surrogate is valid JSON text
        "[" + ",".join(["1"] * 1000) + "]",  # many short numbers are not one long one
        json.dumps({"x": json.loads(nested(MAX_DEPTH - 1))}),  # exactly 64 levels
        '  {"spaces": "around"}  \n',
    ],
)
def test_rfc_8259_json_passes_unchanged(text):
    assert parse(text.encode()) == json.loads(text)


def test_a_megabyte_of_brackets_is_answered():
    """What a megabyte of brackets gives; how long it takes is benchmarks/bench_json_body.py."""
    wide = b"[" + b",".join(b'[1,{"a":"b"}]' for _ in range(70_000)) + b"]"
    parsed = parse(wide)
    assert len(parsed) == 70_000 and parsed[-1] == [1, {"a": "b"}]
    with pytest.raises(JSONBodyError, match="deeper than 64 levels"):
        parse(nested(500_000))


def test_a_whole_number_with_a_fraction_or_exponent_is_that_integer():
    """JSON Schema's `integer` counts 5.0 as 5 (schemathesis sends it for integer fields):
    a strict int field must take it, so the parser reads it as the integer."""
    value = parse(b'{"i": 5.0, "e": 1e3, "f": 2.5, "big": 1e300, "neg": -7.0}')
    assert value == {"i": 5, "e": 1000, "f": 2.5, "big": 1e300, "neg": -7}
    assert [type(value[k]) for k in ("i", "e", "f", "big", "neg")] == [int, int, float, float, int]
