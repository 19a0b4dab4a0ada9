"""Save-time checks of a step's http, workflow (SPEC §14) or code (§17) call, for validate.py: which
call a step makes, the call as stored, where `{{ secrets.NAME }}` may stand, and every
text of an http step that `{{ }}` may fill."""

from __future__ import annotations

import re
from typing import Any

from orchestra.language import expressions
from orchestra.language.code import source_problems
from orchestra.language.model import Step

ACTIONS = ("agent", "http", "workflow", "code")  # what one call of a step is
# `{{ secrets.NAME }}`: the only way a template names a secret (SPEC §14)
SECRET_REF = re.compile(r"^secrets\.([A-Za-z_][A-Za-z0-9_]{0,63})$")
_SECRETS_WORD = re.compile(r"(?<![\w.])secrets(?!\w)")
SECRETS_ONLY_THERE = "secrets may be used only as {{ secrets.NAME }} in an http step's url and header values"
# Headers the HTTP client writes itself (framing, the connection, the host it connects to)
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
                              "keep-alive", "proxy-connection", "trailer"})
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")


def action_of(raw: dict[str, Any], where: str, checked: Any) -> str | None:
    """Which call a step makes (agent, http or workflow); None (problem added) for more
    than one, or for an http or workflow step with agent-only fields."""
    given = [name for name in ACTIONS if raw.get(name) is not None]
    if "code" in given:  # a code step names every field it may not have
        bad = [name for name in (*given, "prompt", "tools", "on_tool_error", "default")
               if name != "code" and name in raw]
        for name in dict.fromkeys(bad):
            checked.add(f"{where}.{name}", "is not a field of a code step")
        return None if bad else "code"
    if len(given) > 1:
        checked.add(where, "a step makes one call: agent (with prompt), http or workflow")
        return None
    kind = given[0] if given else "agent"
    if kind != "agent":
        bad = [name for name in ("prompt", "tools", "on_tool_error", "default") if name in raw]
        for name in bad:
            checked.add(f"{where}.{name}", f"is not a field of {'an' if kind == 'http' else 'a'} {kind} step")
        if bad:
            return None
    return kind


def clean_actions(step: Step, clean: dict[str, Any], checked: Any, where: str) -> None:
    """An http, workflow or code call as stored (only the fields given), with its own checks."""
    if step.code is not None:
        _clean_code(step.code.source, clean, checked, where)
    if step.http is not None:
        http = step.http.model_dump(exclude_none=True, exclude_unset=True)
        http["method"], http["url"] = step.http.method, step.http.url
        if "timeout_seconds" in step.http.model_fields_set:
            http["timeout_seconds"] = step.http.timeout_seconds
        if "body" in step.http.model_fields_set:
            http["body"] = step.http.body
        for name, value in (step.http.headers or {}).items():
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}", name):
                checked.add(f"{where}.http.headers", f"{name!r} is not a header name (an RFC 9110 token)")
            elif name.lower() in RESERVED_HEADERS:
                checked.add(f"{where}.http.headers.{name}", "is written by the HTTP client itself")
            if not _HEADER_VALUE.fullmatch(value) or len(value) > 8192:
                checked.add(f"{where}.http.headers.{name}",
                            "must be at most 8192 printable ASCII characters (tabs allowed)")
        if step.http.method in ("GET", "HEAD", "OPTIONS") and "body" in http and http["body"] is not None:
            checked.add(f"{where}.http.body", f"a {step.http.method} request has no body")
        clean["http"] = http
    if step.workflow is not None:
        flow = {"template": step.workflow.template.strip(), "input": step.workflow.input}
        if step.workflow.version is not None:
            flow["version"] = step.workflow.version
        clean["workflow"] = flow
        checked.children.append((f"{where}.workflow.template", flow["template"], flow))


def _clean_code(source: str, clean: dict[str, Any], checked: Any, where: str) -> None:
    """A code step's source (SPEC §17): parsed, never run, here."""
    for problem in source_problems(source):
        checked.add(f"{where}.code.source", problem)
    clean["code"] = {"source": source}


def mentions_secrets(source: str) -> bool:
    """Whether an expression names the `secrets` variable (string literals aside)."""
    return "secrets" in source and bool(_SECRETS_WORD.search(expressions.without_strings(source)))


def http_texts(http: dict[str, Any], where: str) -> list[tuple[str, Any, bool]]:
    """(field, text, may name a secret) of each text of an http step `{{ }}` may fill."""
    texts = [(f"{where}.http.url", http.get("url"), True)]
    texts += [(f"{where}.http.headers.{name}", value, True) for name, value in (http.get("headers") or {}).items()]
    texts += [(f"{where}.http.body{sub}", value, False) for sub, value in _strings(http.get("body"), "")]
    return texts


def _strings(value: Any, where: str) -> list[tuple[str, str]]:
    """Every string of a JSON value, with its path (`.a.0`), keys aside."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _strings(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in _strings(v, f"{where}.{i}")]
    return []
