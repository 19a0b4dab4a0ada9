"""Strict JSON for request bodies: RFC 8259 text in UTF-8, and nothing Python's own
`json` would let through besides.

Refused, each with a plain sentence (the caller turns it into 400 `BadRequestError`):
a byte order mark; UTF-16 or UTF-32; bytes that are not UTF-8; nesting deeper than
`MAX_DEPTH` (checked on the text before parsing, so no depth can exhaust the parser's
recursion); `NaN`, `Infinity`, `-Infinity`; a key twice in one object; a number longer
than `MAX_NUMBER_CHARS` characters or too large for a double. (A `\\u` escape of half a
surrogate pair is valid JSON text: it passes here; string fields refuse it, a 422.)
A whole number written as `5.0` or `5e0` is read as the integer 5 (JSON Schema's
`integer` counts it as one).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64
MAX_NUMBER_CHARS = 100


class JSONBodyError(ValueError):
    """The body is not strict JSON; the message is a sentence for the client."""


_KEEP = b'"[]{},:0123456789+-.eE'
_NOT_KEPT = bytes(b for b in range(256) if b not in _KEEP)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STRING = re.compile(rb'"[^"]*"')
_LONG_NUMBER = re.compile(rb"[-+.eE0-9]{%d,}" % (MAX_NUMBER_CHARS + 1))
_DEEP_OPENING = re.compile(rb"[\[{]{%d}" % (MAX_DEPTH + 1))
_INNERMOST_PAIR = re.compile(rb"\[\]|\{\}")
_TOO_DEEP = f"The request body nests arrays and objects deeper than {MAX_DEPTH} levels."
_TOO_LONG = f"The request body has a number longer than {MAX_NUMBER_CHARS} characters."


def parse(raw: bytes) -> Any:
    """The JSON value of `raw`; JSONBodyError when it is not strict JSON."""
    text = _decode(raw)
    _check_outside_strings(raw)
    try:
        return json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float)
    except JSONBodyError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONBodyError(
            f"The request body is not valid JSON (line {exc.lineno}, column {exc.colno})."
        ) from None
    except RecursionError:  # unreachable after the depth check; never a 500 regardless
        raise JSONBodyError(_TOO_DEEP) from None
    except ValueError:  # an integer past Python's conversion limit
        raise JSONBodyError(_TOO_LONG) from None


def _decode(raw: bytes) -> str:
    if raw.startswith(b"\xef\xbb\xbf"):
        raise JSONBodyError("The request body starts with a byte order mark; send UTF-8 JSON without one.")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in raw[:4]:
        raise JSONBodyError("The request body looks like UTF-16 or UTF-32; send it as UTF-8.")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONBodyError(f"The request body is not valid UTF-8 (at byte {exc.start}).") from None


def _check_outside_strings(raw: bytes) -> None:
    """Number length and nesting depth, read from the text outside strings with C-speed
    byte passes and no recursion. Escaped backslashes and quotes go first (left to right,
    as a parser pairs them), then every byte that is not a quote, bracket or number
    character, then the strings. Each pass over the brackets then removes the innermost
    pairs: a pair left after MAX_DEPTH passes is one level too deep. (Unbalanced brackets
    stop the passes early; the parser reports the syntax error.)"""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = _STRING.sub(b"", unescaped.translate(None, _NOT_KEPT))
    if _LONG_NUMBER.search(outside):
        raise JSONBodyError(_TOO_LONG)
    brackets = outside.translate(None, _NOT_BRACKET)
    if _DEEP_OPENING.search(brackets):
        raise JSONBodyError(_TOO_DEEP)
    for done in range(MAX_DEPTH):
        if len(brackets) <= 2 * (MAX_DEPTH - done):
            return  # too few brackets left to nest deeper
        reduced = _INNERMOST_PAIR.sub(b"", brackets)
        if len(reduced) == len(brackets):
            return
        brackets = reduced
    if _INNERMOST_PAIR.search(brackets):
        raise JSONBodyError(_TOO_DEEP)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 40 else key[:40] + "…"
                raise JSONBodyError(f"The request body has the key {json.dumps(shown)} twice in one object.")
            seen.add(key)
    return result


def _constant(name: str) -> Any:
    raise JSONBodyError(f"The request body contains {name}, which is not a JSON number.")


def _float(digits: str) -> float | int:
    """A number written with a fraction or exponent; a whole one (`5.0`, `1e3`) is the
    integer it equals, as JSON Schema counts it, so an integer field takes it."""
    value = float(digits)  # its length is checked before parsing
    if math.isinf(value):
        raise JSONBodyError("The request body has a number too large to represent.")
    if value.is_integer() and abs(value) <= _EXACT:
        return int(value)
    return value


_EXACT = 2**53  # past it a double no longer holds every integer
