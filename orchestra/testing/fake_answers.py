"""The fake model's unscripted answers, and the `fake:` directives a prompt may carry.

With nothing scripted, a request is answered from its messages: `echo` mode replies
"Echo: <last user message>"; `assistant` mode calls `calculator` for a calculation, or
an offered MCP tool the prompt names, else replies in words. A request asking for
structured output (`response_format` json_schema) gets a small value of that schema.

A prompt steers the answer with directives, written anywhere in it (DIRECTIVES_HELP
lists them; `python -m orchestra.testing.fake_llm --help` prints it):

    fake:category=billing fake:urgency=4 fake:approved=false   structured fields
    fake:tool=time.get_current_time fake:args={"timezone": "Europe/Paris"}
    fake:fail=2                  the first 2 requests with this prompt fail (HTTP 400)
    fake:fail=2 fake:fail_status=503                        ... with another status
    fake:text=Done.              the reply's text
    fake:cached=3                3 of the prompt's tokens are reported as cached

A value is read as JSON when it parses (`4`, `false`, `{"a": 1}`, `"two words"`), else
as the text up to the next space. Failures are counted per distinct prompt (its last
user message), so a step's retries see the failures run out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from orchestra.testing.fake_script import ScriptedReply

DIRECTIVES_HELP = """\
directives (written anywhere in a step's prompt, e.g. in a template):
  fake:NAME=VALUE      a structured answer's field NAME takes VALUE (JSON when it parses:
                       fake:category=billing fake:urgency=4 fake:approved=false)
  fake:tool=TOOL       call TOOL (catalog name, e.g. time.get_current_time) first, once
  fake:args=JSON       the tool call's arguments: fake:args={"timezone": "Europe/Paris"}
  fake:fail=N          the first N requests with this prompt answer an error (a step's
                       retry and on_error can be tried: fake:fail=2 with retry 3 succeeds)
  fake:fail_status=S   the status of those errors (default 400; 429/5xx are retried by
                       orchestra's client first, ORCHESTRA_LLM_RETRIES)
  fake:value=VALUE     the whole answer of a step whose output_schema is not an object
  fake:text=TEXT       the reply's text (quote several words: fake:text="All done.")
  fake:cached=N        N of the prompt's tokens are reported as cached (usage)
unscripted answers: echo mode says "Echo: <prompt>"; assistant mode calls calculator
for a calculation and an MCP tool the prompt names, else answers in words; a structured
step gets a value of its schema (the enum value the prompt mentions, else the first;
true for booleans; the minimum, else 1, for numbers) with fields set by directives."""

RESERVED = frozenset({"tool", "args", "fail", "fail_status", "text", "cached"})  # not field names
_DIRECTIVE = re.compile(r"(?<![\w:])fake:([A-Za-z_][A-Za-z0-9_.-]*)=")
_DECODER = json.JSONDecoder()


@dataclass
class Directives:
    """What one prompt asks of the fake."""

    fields: dict[str, Any] = field(default_factory=dict)
    tool: str | None = None
    args: dict[str, Any] | None = None
    fail: int = 0
    fail_status: int = 400
    text: str | None = None
    cached: int = 0

    @classmethod
    def of(cls, prompt: str) -> Directives:
        found = cls()
        for match in _DIRECTIVE.finditer(prompt):
            name, value = match.group(1), _value_at(prompt, match.end())
            if name == "tool":
                found.tool = str(value)
            elif name == "args" and isinstance(value, dict):
                found.args = value
            elif name in ("fail", "fail_status", "cached") and isinstance(value, int) and not isinstance(value, bool):
                setattr(found, name, value)
            elif name == "text":
                found.text = value if isinstance(value, str) else json.dumps(value)
            elif name not in RESERVED:
                found.fields[name] = value
        return found


def _value_at(text: str, start: int) -> Any:
    """The JSON value at `start`, else the word there."""
    try:
        return _DECODER.raw_decode(text, start)[0]
    except ValueError:
        word = re.match(r"\S*", text[start:])
        return word.group(0) if word else ""


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def count_words(messages: list[dict[str, Any]]) -> int:
    return sum(len(content_text(m.get("content")).split()) for m in messages) or 1


_CALCULATION = re.compile(r"[-+(]*\d[\d.\s]*(?:[-+*/^%×÷]+[\s(]*[\d.]+[\s)]*)+")
_MCP_WIRE = re.compile(r"_[0-9a-f]{6}$")  # the hash orchestra appends to an MCP tool's name


def _catalog_name(wire: str) -> str:
    return _MCP_WIRE.sub("", wire).replace("__", ".", 1)


def _default_args(schema: dict[str, Any], prompt: str) -> dict[str, Any]:
    """Required arguments filled from their schema (enum, default, type), text last."""
    properties = schema.get("properties") or {}
    args = {}
    for key in schema.get("required", []):
        sub = properties.get(key) or {}
        if isinstance(sub.get("enum"), list) and sub["enum"]:
            args[key] = sub["enum"][0]
        elif "default" in sub:
            args[key] = sub["default"]
        else:
            args[key] = {"number": 1, "integer": 1, "boolean": True}.get(sub.get("type"), prompt[:200])
    return args


def _tool_call(body: dict[str, Any], prompt: str, wanted: Directives) -> ScriptedReply | None:
    """The tool call a prompt asks for (fake:tool, or an MCP tool it names), or None."""
    for tool in body.get("tools") or []:
        function = tool.get("function", {})
        wire = function.get("name") or ""
        catalog = _catalog_name(wire)
        if wanted.tool is not None:
            chosen = wanted.tool in (wire, catalog)
        else:
            chosen = "." in catalog and catalog in prompt
        if chosen:
            args = wanted.args if wanted.args is not None else _default_args(function.get("parameters") or {}, prompt)
            return ScriptedReply(kind="tool_calls", tool_calls=[(wire, args)])
    return None


def _friendly_reply(body: dict[str, Any], prompt: str, wanted: Directives) -> ScriptedReply:
    """`assistant` mode: call `calculator` for a calculation, or a tool the prompt asks
    for or names (arguments from fake:args, else from the tool's schema), else reply."""
    messages = body.get("messages") or []
    tools = {t.get("function", {}).get("name") for t in body.get("tools") or []}
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        result = content_text(last.get("content"))
        return ScriptedReply(text=f"The tool answered: {result[:200]}. That is my answer.")
    match = _CALCULATION.search(prompt)
    if wanted.tool is None and "calculator" in tools and match:
        expression = match.group(0).strip().replace("×", "*").replace("÷", "/")
        return ScriptedReply(kind="tool_calls", tool_calls=[("calculator", {"expression": expression})])
    called = _tool_call(body, prompt, wanted)
    if called is not None:
        return called
    return ScriptedReply(text=f'Here is a short answer to "{prompt[:200]}": done.')


def _echo_reply(body: dict[str, Any], prompt: str, wanted: Directives) -> ScriptedReply:
    messages = body.get("messages") or []
    if wanted.tool is not None and not (messages and messages[-1].get("role") == "tool"):
        called = _tool_call(body, prompt, wanted)
        if called is not None:
            return called
    return ScriptedReply(text=f"Echo: {prompt[:200]}")


def requested_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema a request asks the answer to follow (`response_format` json_schema)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        return schema if isinstance(schema, (dict, bool)) else {}
    return None


def schema_instance(schema: Any, hint: str = "", depth: int = 0, fields: dict[str, Any] | None = None) -> Any:
    """A small value of `schema`'s shape: required properties filled (and any property a
    directive names, with its value), the enum value the prompt mentions (else the
    first), `true` for booleans, the minimum (else 1) for numbers, a short text."""
    fields = fields or {}
    if not isinstance(schema, dict) or depth > 8:
        return None
    fixed = _fixed_value(schema, hint)
    if fixed is not _NO_VALUE:
        return fixed
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema_instance(schema[key][0], hint, depth + 1, fields)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        names = list(schema.get("required") or list(props))
        names += [name for name in props if name in fields and name not in names]
        return {name: fields[name] if name in fields else schema_instance(props.get(name, {}), hint, depth + 1, fields)
                for name in names}
    if kind == "array":
        count = max(1, int(schema.get("minItems") or 1))
        return [schema_instance(schema.get("items") or {}, hint, depth + 1, fields) for _ in range(count)]
    return _scalar_instance(kind, schema)


_NO_VALUE = object()  # the schema does not fix its value


def _fixed_value(schema: dict[str, Any], hint: str) -> Any:
    """The value a `const`, an `enum` (the one the prompt mentions, else the first) or a
    `default` fixes; _NO_VALUE when none does."""
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        lowered = hint.lower()
        mentioned = [v for v in schema["enum"] if isinstance(v, str) and v.lower() in lowered]
        return mentioned[0] if mentioned else schema["enum"][0]
    return schema.get("default", _NO_VALUE)


def _scalar_instance(kind: Any, schema: dict[str, Any]) -> Any:
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return max(1, int(low) + (1 if "exclusiveMinimum" in schema else 0))
    if kind == "string":
        text = "fake answer"
        low = int(schema.get("minLength") or 0)
        return (text * (low // len(text) + 1))[:max(low, len(text))]
    return None  # null, or a type this fake does not fill


def unscripted_reply(body: dict[str, Any], behavior: str) -> ScriptedReply:
    """The answer to a request when nothing is scripted (failures are the caller's:
    they need a count kept across requests)."""
    messages = body.get("messages") or []
    prompt = last_user_text(messages)
    wanted = Directives.of(prompt)
    make = _friendly_reply if behavior == "assistant" else _echo_reply
    reply = make(body, prompt, wanted)
    schema = requested_schema(body)
    if schema is not None and reply.kind != "tool_calls":  # structured output
        value = schema_instance(schema, prompt, fields=wanted.fields)
        if isinstance(schema, dict) and schema.get("type") not in (None, "object") and "value" in wanted.fields:
            value = wanted.fields["value"]  # a scalar schema: fake:value=…
        reply = ScriptedReply(text=json.dumps(value, separators=(",", ":")))
    elif wanted.text is not None and reply.kind == "text":
        reply = ScriptedReply(text=wanted.text)
    return reply
