"""What a question's answer must look like, said in a line or two at the prompt.

A human step with an `output_schema` takes JSON: the prompt names the fields (type, and
whether required) and shows an example built from the schema, so the first answer
typed can be the right one.
"""

from __future__ import annotations

import json
from typing import Any

from orchestra.language.examples import MAX_FIELDS, schema_example


def _type_of(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any value"
    if "enum" in schema and isinstance(schema["enum"], list):
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"][:6])
    if "const" in schema:
        return json.dumps(schema["const"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and high is not None:
            return f"{kind} {low}–{high}"
    return str(kind) if kind else "any value"


def example(schema: Any) -> Any:
    """A value of `schema`'s shape with every property shown (at most MAX_FIELDS)."""
    return schema_example(schema, every_property=True)


def expected_answer(schema: Any) -> list[str]:
    """The lines that tell what to type; [] for a plain-text answer."""
    if schema is None:
        return []
    required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict) and properties:
        fields = [f"{name} ({_type_of(sub)}{', required' if name in required else ''})"
                  for name, sub in list(properties.items())[:MAX_FIELDS]]
        more = len(properties) - MAX_FIELDS
        head = "answer with a JSON object: " + ", ".join(fields) + (f" and {more} more" if more > 0 else "")
    else:
        head = f"answer with JSON ({_type_of(schema)})"
    shown = json.dumps(example(schema), ensure_ascii=False)
    return [head, f"e.g. {shown if len(shown) <= 200 else shown[:197] + '...'}"]
