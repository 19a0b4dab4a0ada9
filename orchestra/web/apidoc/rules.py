"""Documented field rules: the checks a service makes, stated for the OpenAPI document.

Request models keep the service as the one place that enforces names, lengths and
references (so its 422 speaks in its own words and reports every problem at once);
`rule(...)` writes those same limits into the model's JSON Schema. The numbers and
character sets come from the services' own constants (`services.charset`), and
schemathesis checks both directions (valid data accepted, invalid data refused) against
a real server.

Patterns are regular expressions that ECMA-262 (with the `u` flag, as JSON Schema
2020-12 asks) and Python both read, searched (not anchored) as JSON Schema says; those
below anchor themselves. White space is what Python's strip() removes, control and
format characters are Unicode's Cc and Cf. What no pattern can say: names are NFKC
normalised before their length is counted, so a name whose compatibility characters
expand (`ﬁ` is two letters) may still be too long by a few characters.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import Field
from pydantic_core import PydanticUndefined

from orchestra.services import agents, charset, providers

# clean_text's own default limit, read from it rather than repeated
_TEXT_MAX = inspect.signature(providers.clean_text).parameters["max_length"].default

NO_NUL = r"^[^\u0000]*$"  # PostgreSQL text cannot hold NUL: every body refuses it (422)
_CONTROL = charset.char_class(charset.CONTROL_RANGES)
_SPACE = charset.char_class(charset.SPACE_RANGES)
# White space around a URL, as providers.BASE_URL_PATTERN writes it.
WS = r"[\s\u001c-\u001f\u0085]"


REF = "#/components/schemas/{model}"
# Models a rule refers to (`items=Step`) by name: the document adds them to its components.
REFERENCED_MODELS: dict[str, type] = {}
# Rules of a model the web layer states for a model it does not own (the language's Step):
# component name -> a function that amends its cleaned schema in place.
AMENDMENTS: dict[str, Any] = {}


def amends(name: str):
    """Decorator: register a function that adds rules to the component `name`."""
    def register(function):
        AMENDMENTS[name] = function
        return function
    return register


def rule(default: Any = PydanticUndefined, *, description: str | None = None, **schema: Any) -> Any:
    """A model field whose rules the service enforces, documented with JSON Schema keywords.
    A keyword's value may be a model class (`items=Step`): it becomes a reference to it;
    or a function: its value, computed when the schema is made (costly character sets)."""
    for key, value in schema.items():
        if isinstance(value, type):
            REFERENCED_MODELS[value.__name__] = value
            schema[key] = {"$ref": REF.format(model=value.__name__)}
    if any(callable(value) for value in schema.values()):
        return Field(default, description=description, json_schema_extra=_later(schema))
    return Field(default, description=description, json_schema_extra=schema or None)


def _later(schema: dict[str, Any]):
    def extra(out: dict[str, Any]) -> None:
        out.update({key: value() if callable(value) else value for key, value in schema.items()})
    return extra


def stripped(max_length: int, *, controls: bool = True) -> str:
    """1..max_length characters once surrounding white space is stripped; without
    control or format characters (`controls=False`: without NUL only)."""
    bad = _CONTROL if controls else r"\u0000"
    inner = f"[^{bad}]"
    edge = f"[^{_SPACE}{bad}]"
    return f"^[{_SPACE}]*{edge}(?:{inner}{{0,{max_length - 2}}}{edge})?[{_SPACE}]*$"


def user_name_pattern(low: int, high: int) -> Any:
    """Letters, digits and _ . - @ once NFKC-normalised (a character whose compatibility
    form is one of those counts as it), stripped. Computed when the document is built."""
    return lambda: f"^[{_SPACE}]*[{charset.nfkc_class(_USER_NAME_CHAR)}]{{{low},{high}}}[{_SPACE}]*$"


_USER_NAME_CHAR = r"[\w.@-]"  # auth.USER_NAME_PATTERN's characters


def display_name(max_length: int) -> dict[str, Any]:
    return {"pattern": stripped(max_length), "x-normalised": "NFKC, stripped"}


def free_text(max_length: int) -> dict[str, Any]:
    return {"maxLength": max_length, "pattern": NO_NUL}


# An API key: blank (no key), or up to 4096 printable ASCII characters (it is sent in a header).
API_KEY_PATTERN = r"^[\s\u001c-\u001f\u0085]*(?:[!-~]{1,4096})?[\s\u001c-\u001f\u0085]*$"
# A base URL: blank (the kind's default), or http(s)://host[:port][/path…] (scheme in any
# case), with no white space or control character inside. The service checks with this
# very pattern (providers.BASE_URL), so the document states the rule exactly.
BASE_URL_PATTERN = providers.BASE_URL_PATTERN
# The same, not blank (an MCP server's url: mcp.clean_url checks BASE_URL_PATTERN and blankness).
_BLANK_TAIL = f")?{WS}*$"
assert BASE_URL_PATTERN.endswith(_BLANK_TAIL), "BASE_URL_PATTERN changed its form"
URL_PATTERN = BASE_URL_PATTERN[: -len(_BLANK_TAIL)] + f"){WS}*$"


# Every id the server assigns is a UUID (db.models.new_id), written in lower case.
ID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def id_rule(default: Any = PydanticUndefined, *, description: str) -> Any:
    """A reference to a stored resource by its id."""
    return rule(default, description=description, pattern=ID_PATTERN)


def name_rule(default: Any = PydanticUndefined) -> Any:
    """A display name of a provider, skill or worker (`providers.clean_name`)."""
    name_max = providers.NAME_MAX
    return rule(default, description=f"1-{name_max} characters (NFKC, stripped).", **display_name(name_max))


def model_rule(default: Any = PydanticUndefined) -> Any:
    """A model id (`providers.clean_model`): free text, stripped."""
    model_max = providers.MODEL_MAX
    return rule(
        default,
        description=f"A model id: 1-{model_max} characters (stripped).",
        pattern=stripped(model_max, controls=False),
    )


def text_rule(default: Any = PydanticUndefined, *, long: bool = False) -> Any:
    """Free text (`providers.clean_text`); `long`: prompts and instructions."""
    limit = agents.PROMPT_MAX if long else _TEXT_MAX
    return rule(default, description=f"At most {limit} characters.", **free_text(limit))
