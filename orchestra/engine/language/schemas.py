"""JSON Schema (2020-12) in the workflow language: template `input_schema`, step
`output_schema`, human replies (SPEC §7, §15).

A schema is checked on save: a JSON object of at most 64 KiB, valid against the 2020-12
meta-schema, with no remote `$ref` (only `#…` references inside the schema itself; the
validator's retriever refuses every URI, so nothing is ever fetched), and every regular
expression in it (`pattern`, `patternProperties` keys, `propertyNames` patterns) one the
Rust `regex` crate accepts. Values are validated with every violation reported at a path
such as `input.topics.2`.

Everything runs in `jsonschema-rs` (Rust) with `RegexOptions`: the `regex` crate matches
in linear time and cannot backtrack, so a pattern such as `^(a+)+$` costs microseconds
on any input. Python's `re` never runs a user's pattern — not for the answer, not for
wording the violations, not for the meta-schema's `format: regex` (which the same crate
checks). A pattern that needs backtracking (backreferences, lookaround) is refused at
save with its path. One validator is built per schema and kept.
"""

from __future__ import annotations

import json
from functools import lru_cache
from itertools import islice
from typing import Any

import jsonschema_rs

MAX_BYTES = 64 * 1024
MAX_VIOLATIONS = 20
_COLLECTED = 200  # violations read before sorting by path (each is cheap; bounded anyway)
NO_BACKTRACKING = ("patterns run on a regular-expression engine that cannot backtrack: no "
                   "backreferences or lookaround, and a bounded compiled size")
_NOT_REGEX = ' is not a "regex"'  # jsonschema-rs's meta-schema `format: regex` violation


def _encoded(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _remote_refs(node: Any, where: str = "") -> list[str]:
    """Paths of `$ref`/`$dynamicRef` values that point outside this schema."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}" if where else key
            if key in ("$ref", "$dynamicRef") and isinstance(value, str) and not value.startswith("#"):
                found.append(here)
            else:
                found.extend(_remote_refs(value, here))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_remote_refs(value, f"{where}.{i}" if where else str(i)))
    return found


def _dotted(path: Any) -> str:
    return ".".join(str(p) for p in path)


def _schema_problem(exc: jsonschema_rs.ValidationError) -> tuple[str, str]:
    """A refused schema as (sub-path, problem): a regular expression the linear engine
    refuses, a meta-schema violation, or a reference that does not resolve."""
    message = str(getattr(exc, "message", exc))
    path = _dotted(getattr(exc, "instance_path", ()) or ())
    if message.endswith(_NOT_REGEX):
        return path, f"{message.removesuffix(_NOT_REGEX)[:200]} cannot be used: {NO_BACKTRACKING}"
    if isinstance(getattr(exc, "kind", None), jsonschema_rs.ValidationErrorKind.Referencing):
        return path, f"has a $ref that does not resolve: {message}"[:300]
    return path, f"is not a valid JSON Schema (2020-12): {message[:300]}"


def check_schema(schema: Any) -> list[tuple[str, str]]:
    """Problems of a schema as (sub-path, problem); [] when it may be stored."""
    if not isinstance(schema, (dict, bool)):
        return [("", "must be a JSON Schema (an object)")]
    size = len(_encoded(schema).encode("utf-8"))
    if size > MAX_BYTES:
        return [("", f"is {size} bytes of JSON; the limit is {MAX_BYTES} (64 KiB)")]
    problems = [(path, "remote $ref is not allowed; use '#/…' references inside the schema")
                for path in _remote_refs(schema)]
    if problems:
        return problems
    try:
        _validator(_encoded(schema))  # meta-schema, patterns and local references, in Rust
    except jsonschema_rs.ValidationError as exc:
        return [_schema_problem(exc)]
    except (ValueError, jsonschema_rs.ReferencingError) as exc:
        return [("", f"has a $ref that does not resolve: {exc}"[:300])]
    return []


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"remote references are not fetched: {uri}")


@lru_cache(maxsize=1024)
def _validator(encoded: str) -> Any:
    """The Rust validator of a schema (its JSON text): linear-time regular expressions,
    formats as annotations (as the 2020-12 default), no retrieval."""
    return jsonschema_rs.Draft202012Validator(
        json.loads(encoded), retriever=_no_fetch, pattern_options=jsonschema_rs.RegexOptions())


_BY_ID: dict[int, tuple[Any, Any]] = {}  # id(schema) -> (schema, validator)


def validator_for(schema: Any) -> Any:
    """The validator of a schema already checked by `check_schema`, found by the schema
    object itself first (a run's steps keep theirs) and by its JSON text otherwise."""
    cached = _BY_ID.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    validator = _validator(_encoded(schema))
    if len(_BY_ID) > 4096:
        _BY_ID.clear()
    _BY_ID[id(schema)] = (schema, validator)
    return validator


def violations(value: Any, schema: Any, *, root: str) -> list[dict[str, str]]:
    """Every way `value` breaks `schema`, as `{field, problem}` with paths under `root`
    (`input.topics.2`); [] when it validates."""
    validator = validator_for(schema)
    if validator.is_valid(value):
        return []
    errors = sorted(islice(validator.iter_errors(value), _COLLECTED),
                    key=lambda e: [str(p) for p in e.instance_path])
    found = []
    for error in errors[:MAX_VIOLATIONS]:
        path = _dotted([root, *error.instance_path] if root else error.instance_path)
        found.append({"field": path or "value", "problem": error.message[:300]})
    return found


def describe(found: list[dict[str, str]], limit: int = 5) -> str:
    """Violations as one readable sentence."""
    text = "; ".join(f"{v['field']}: {v['problem']}" for v in found[:limit])
    return text + (f" (and {len(found) - limit} more)" if len(found) > limit else "")
