"""HTTP steps (SPEC §14): render the request, send it through the egress rule, keep the
step's secrets out of everything it writes.

`url` and header values may hold `{{ secrets.NAME }}` (read from the store when the step
runs, decrypted with the server's key, sent only to the secret's hosts: http_secrets.py)
and `{{ expr }}`; `body` is a string rendered as
a prompt is (sent as text) or a JSON value whose strings are rendered (sent as JSON; a
string that is exactly one `{{ expr }}` becomes the expression's value). The answer is
the step's output `{status, headers, body}` with every secret value the step used
replaced by `***` (an echoed header included), as are its events, its error and its span.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from orchestra import redaction
from orchestra.engine.http_call import HttpCaller, HttpFailure, HttpRequest
from orchestra.engine.http_secrets import SecretGuard
from orchestra.engine.live import LiveRun, StepFailure
from orchestra.engine.model import At, StepDef
from orchestra.engine.sizes import prompt_too_large, utf8_size
from orchestra.engine.store.secrets import SecretReader
from orchestra.language.calls import SECRET_REF
from orchestra.language.expressions import (
    LEGACY,
    PLACEHOLDER,
    ExpressionError,
    Scope,
    render,
)
from orchestra.observability import tracing

_SEND_AS_IS = ("GET", "HEAD", "OPTIONS")


class StepRequestFailure(StepFailure):
    """An HTTP step's failed attempt; `retry_after`: the wait the server asked for."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def secret_names(http: dict[str, Any]) -> set[str]:
    """The secrets an http step's url and header values name."""
    texts = [http.get("url") or "", *(http.get("headers") or {}).values()]
    return {m.group(1) for text in texts for source in PLACEHOLDER.findall(text)
            if (m := SECRET_REF.match(source.strip()))}


class HttpSteps:
    """Engine part: one attempt of an `http` step (the client, the secrets it names:
    read by `secrets`, opened by `decrypt`)."""

    def __init__(self, settings: Any, *, secrets: SecretReader, decrypt: Callable[[str], str] | None) -> None:
        self.settings = settings
        self.secrets = secrets
        self.decrypt = decrypt
        self._caller: HttpCaller | None = None

    def caller(self) -> HttpCaller:
        if self._caller is None:
            self._caller = HttpCaller(self.settings.step_egress)
        return self._caller

    async def secrets_of(self, names: set[str], workspace_id: str | None = None
                         ) -> tuple[dict[str, str], dict[str, list[str] | None]]:
        """The plain values and the hosts of `names`, as a run of `workspace_id` sees them
        (its workspace's secret, else the instance-wide one). A name no secret has gets `***` (what
        a value shows as; no stored value is that short) and no hosts: its step then fails
        at the request with the sentence, and the URL as shown, that a secret which may not
        go there gets (SPEC §15b: nothing tells a user which names exist)."""
        if not names:
            return {}, {}
        rows = await self.secrets.read(names, workspace_id)
        values: dict[str, str] = dict.fromkeys(names, redaction.MASK)
        hosts: dict[str, list[str] | None] = dict.fromkeys(names)
        for row in rows:
            try:
                if self.decrypt is None:
                    raise ValueError("no key")
                values[row.name] = self.decrypt(row.value_encrypted)
            except ValueError:
                raise StepFailure(f"The secret '{row.name}' cannot be decrypted with this server's key "
                                  "(ORCHESTRA_SECRET_KEY changed since it was stored).") from None
            hosts[row.name] = row.hosts
        redaction.remember(v for v in values.values() if v != redaction.MASK)
        return values, hosts

    async def request(self, step: StepDef, at: At, scope: Scope,
                      workspace_id: str | None = None) -> tuple[HttpRequest, dict[str, str]]:
        """The request an http step of a run of `workspace_id` sends, and the secret values it holds."""
        http, where = step.http, at.path
        values, hosts = await self.secrets_of(secret_names(http), workspace_id)
        limit = self.settings.prompt_max_bytes
        try:
            url = await _render(http["url"], scope, values, limit, where)
            headers = {name: await _render(value, scope, values, limit, where)
                       for name, value in (http.get("headers") or {}).items()}
            content = await _content(http, headers, scope, limit, where)
        except ExpressionError as exc:
            raise StepFailure(exc.message) from None
        for name, value in headers.items():
            if not value.isascii() or "\r" in value or "\n" in value or "\x00" in value:
                raise StepFailure(f"The header {name} of step '{where}' renders to a value with line breaks or "
                                  "characters outside ASCII; encode what you insert.")
        guard = SecretGuard(values, hosts) if values else None
        real = {k: v for k, v in values.items() if v != redaction.MASK}
        return HttpRequest(http["method"], url, headers, content, guard), real

    async def attempt(self, live: LiveRun, step: StepDef, at: At, scope: Scope) -> dict[str, Any]:
        """Send the request; its answer, or StepRequestFailure (secrets hidden)."""
        request, values = await self.request(step, at, scope, live.workspace_id)
        secrets = tuple(values.values())
        shown = redaction.scrub_text(request.url, secrets) if secrets else request.url
        span = tracing.start_span(f"http {request.method}", {
            "http.request.method": request.method, "url.full": shown, "orchestra.step": at.path})
        error = None
        try:
            return await self.caller().call(
                request, timeout=float(step.http.get("timeout_seconds") or 30), secrets=secrets)
        except HttpFailure as failure:
            error = failure.message
            raise StepRequestFailure(failure.message, failure.retry_after) from None
        finally:
            span.end(error)

    async def close(self) -> None:
        caller, self._caller = self._caller, None
        if caller is not None:
            await caller.aclose()


async def _content(http: dict[str, Any], headers: dict[str, str], scope: Scope, limit: int,
                   where: str) -> bytes | None:
    """The body as sent (a string as text, else JSON), with a default Content-Type."""
    body = http.get("body")
    if body is None or http["method"] in _SEND_AS_IS:
        return None
    if isinstance(body, str):
        _default(headers, "text/plain; charset=utf-8")
        return (await _render(body, scope, {}, limit, where)).encode("utf-8", "surrogatepass")
    filled = await _fill(body, scope, limit, where)
    content = json.dumps(filled, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(content) > limit:
        raise prompt_too_large(where, len(content), limit)
    _default(headers, "application/json")
    return content


def shown_request(http: dict[str, Any]) -> dict[str, Any]:
    """What `step_started` says of an http step: its method and URL template (secrets are
    placeholders there, never values)."""
    return {"method": http["method"], "url": http["url"]}


def _default(headers: dict[str, str], content_type: str) -> None:
    if not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = content_type


async def _render(template: str, scope: Scope, secrets: dict[str, str], limit: int, where: str) -> str:
    """`template` with `{{ secrets.NAME }}` as the value and every other `{{ }}` rendered
    as in a prompt; StepFailure past `limit` bytes."""
    if "{{" not in template:
        return template
    pieces, end, size = [], 0, 0
    for match in PLACEHOLDER.finditer(template):
        named = SECRET_REF.match(match.group(1).strip())
        value = secrets[named.group(1)] if named and named.group(1) in secrets else await render(match.group(0), scope)
        literal = template[end:match.start()]
        size += utf8_size(literal) + utf8_size(value)
        if size > limit:
            raise prompt_too_large(where, size, limit)
        pieces += (literal, value)
        end = match.end()
    pieces.append(template[end:])
    return "".join(pieces)


async def _fill(value: Any, scope: Scope, limit: int, where: str) -> Any:
    """A JSON body with its strings rendered; a string that is one `{{ expr }}` becomes
    the expression's value."""
    if isinstance(value, str):
        found = PLACEHOLDER.findall(value)
        whole = PLACEHOLDER.fullmatch(value.strip()) if len(found) == 1 else None
        if whole is not None:
            source = whole.group(1)
            legacy = LEGACY.match(source)
            if legacy:
                if legacy.group(1) is None:
                    return scope.variables.get("input")
                state = (scope.variables.get("steps") or {}).get(legacy.group(1))
                return None if state is None else state.get("output")
            return await scope.evaluate(source)
        return await _render(value, scope, {}, limit, where)
    if isinstance(value, dict):
        return {k: await _fill(v, scope, limit, where) for k, v in value.items()}
    if isinstance(value, list):
        return [await _fill(v, scope, limit, where) for v in value]
    return value
