"""JSON Schema (2020-12) in the workflow language: template `input_schema`, step
`output_schema`, human replies (SPEC §7).

A schema is checked on save: a JSON object of at most 64 KiB, valid against the 2020-12
meta-schema, with no remote `$ref` (only `#…` references inside the schema itself; the
validator is given no retriever, so nothing is ever fetched). Values are validated with
every violation reported at a path such as `input.topics.2`.

Validation has a fast path: `jsonschema-rs` (Rust, the same 2020-12 rules) answers
"valid?" in microseconds; only an invalid value goes through `jsonschema`, whose errors
name each violation and its path. Both are built once per schema object and kept.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable

MAX_BYTES = 64 * 1024
MAX_VIOLATIONS = 20


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
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = ".".join(str(p) for p in exc.absolute_path)
        return [(path, f"is not a valid JSON Schema (2020-12): {exc.message[:300]}")]
    try:
        _validator(_encoded(schema)).is_valid(None)  # resolves the local references once
    except Unresolvable as exc:
        return [("", f"has a $ref that does not resolve: {exc}"[:300])]
    return []


@lru_cache(maxsize=1024)
def _validator(encoded: str) -> Draft202012Validator:
    # An empty registry: a reference that is not inside the schema fails, never fetches.
    return Draft202012Validator(json.loads(encoded), registry=Registry())


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"remote references are not fetched: {uri}")


@lru_cache(maxsize=1024)
def _fast(encoded: str) -> Any:
    return jsonschema_rs.Draft202012Validator(json.loads(encoded), retriever=_no_fetch)


_BY_ID: dict[int, tuple[Any, Any, Draft202012Validator]] = {}  # id(schema) -> (schema, fast, full)


def _validators(schema: Any) -> tuple[Any, Draft202012Validator]:
    """(fast, full) validators of a schema, found by the schema object itself first (a
    run's steps keep theirs) and by its JSON text otherwise."""
    cached = _BY_ID.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1], cached[2]
    encoded = _encoded(schema)
    pair = (_fast(encoded), _validator(encoded))
    if len(_BY_ID) > 4096:
        _BY_ID.clear()
    _BY_ID[id(schema)] = (schema, *pair)
    return pair


def validator_for(schema: Any) -> Draft202012Validator:
    """A cached validator for a schema already checked by `check_schema`."""
    return _validators(schema)[1]


def violations(value: Any, schema: Any, *, root: str) -> list[dict[str, str]]:
    """Every way `value` breaks `schema`, as `{field, problem}` with paths under `root`
    (`input.topics.2`); [] when it validates."""
    fast, validator = _validators(schema)
    if fast.is_valid(value):
        return []
    found = []
    errors = sorted(validator.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors[:MAX_VIOLATIONS]:
        path = ".".join([root, *(str(p) for p in error.absolute_path)]) if root else \
            ".".join(str(p) for p in error.absolute_path)
        found.append({"field": path or "value", "problem": error.message[:300]})
    return found


def describe(found: list[dict[str, str]], limit: int = 5) -> str:
    """Violations as one readable sentence."""
    text = "; ".join(f"{v['field']}: {v['problem']}" for v in found[:limit])
    return text + (f" (and {len(found) - limit} more)" if len(found) > limit else "")
