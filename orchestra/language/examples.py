"""An example value of a JSON Schema's shape, for the template type check at save and
for the terminal's hint of what a JSON answer looks like."""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 6  # of an example value
MAX_FIELDS = 8  # properties shown of an object, with every_property


def schema_example(schema: Any, *, every_property: bool = False, depth: int = 0) -> Any:
    """A small value of `schema`'s shape: const, enum (its first value), default, the
    first of anyOf/oneOf/allOf, then a stand-in per type (`true`, the minimum else 1 or
    1.5, `"…"`). An object has its required properties only (optional ones may be absent
    at run time), or, with `every_property`, its first MAX_FIELDS properties."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema_example(schema[key][0], every_property=every_property, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
        properties = schema.get("properties") or {}
        names = list(properties)[:MAX_FIELDS] if every_property else schema.get("required") or []
        return {name: schema_example(properties.get(name, {}), every_property=every_property, depth=depth + 1)
                for name in names if isinstance(name, str)}
    if kind == "array":
        return [schema_example(schema.get("items"), every_property=every_property, depth=depth + 1)]
    low = schema.get("minimum")
    stand_ins = {"boolean": True, "string": "…", "null": None,
                 "integer": int(low) if isinstance(low, (int, float)) else 1,
                 "number": float(low) if isinstance(low, (int, float)) else 1.5}
    return stand_ins.get(kind)
