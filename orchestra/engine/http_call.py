"""One HTTP request of an `http` step (SPEC §14), through the egress rule.

`HttpCaller` keeps one pooled httpx2 client whose every new connection (a redirect's
too) resolves the host once, checks each address against the egress rule and connects
to a checked one (orchestra/egress.py), and whose every request (a redirect's too) is
first checked against the hosts of the secrets it carries (http_secrets.py). `call` answers `{status, headers, body}`:
header names in lower case (repeated ones joined by ", "), `body` the parsed JSON when
the answer says it is JSON, else its text. It fails (`HttpFailure`, a readable message)
for a refused address (the rule's own sentence, naming ORCHESTRA_STEP_EGRESS_ALLOW), a
timeout, an answer over `max_bytes`, and a status >= 400 (with `retry_after` from a 429's
or 503's `Retry-After`). Every text it returns or raises has the step's secret values
replaced by `***`.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx2 as httpx

from orchestra import redaction
from orchestra.egress import EgressPolicy, find_refusal
from orchestra.engine.http_secrets import EXTENSION, SecretGuard, SecretRefused, check_request
from orchestra.tls import client_tls

ANSWER_MAX_BYTES = 1024 * 1024  # an answer over this fails the step (SPEC §14)
MAX_REDIRECTS = 5
RETRY_AFTER_MAX = 3600.0  # a longer Retry-After is waited for this long at most
# HTTP steps keep no cookies: the client is shared by every user's steps, and a cookie one
# step was given would go with another user's call to the same host. A step sends the
# Cookie header it names, nothing else (a policy that allows no domain stores nothing).
_NO_COOKIES = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
_SHOWN_BODY = 300  # characters of an error answer's body quoted in the step's error


class HttpFailure(Exception):
    """The request failed; `message` says why for the user, `retry_after` (seconds) is
    how long the server asked to wait (429/503)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: dict[str, str]
    content: bytes | None = None
    guard: SecretGuard | None = None  # the secrets it carries and where they may go


class HttpCaller:
    """The process's client for HTTP steps (one pool, the egress rule on every connection)."""

    def __init__(self, egress: EgressPolicy, *, max_bytes: int = ANSWER_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._client = httpx.AsyncClient(
            transport=egress.transport(
                verify=client_tls(),
                limits=httpx.Limits(max_connections=500, max_keepalive_connections=100)),
            follow_redirects=True,
            max_redirects=MAX_REDIRECTS,
            trust_env=False,
            cookies=_NO_COOKIES,  # one pool for every user's steps: it must remember nothing
            event_hooks={"request": [check_request]},  # before each request of an exchange is sent
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(self, request: HttpRequest, *, timeout: float,
                   secrets: tuple[str, ...] = ()) -> dict[str, Any]:
        """The answer as `{status, headers, body}`, or HttpFailure."""
        hide = (lambda text: redaction.scrub_text(text, secrets)) if secrets else (lambda text: text)
        shown_url = hide(request.url)
        try:
            built = self._client.build_request(
                request.method, request.url, headers=request.headers, content=request.content, timeout=timeout,
                extensions={EXTENSION: request.guard} if request.guard is not None else None)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError, TypeError) as exc:
            raise HttpFailure(f"{request.method} {shown_url}: not a usable http(s) URL ({hide(str(exc))}).") from None
        if built.url.scheme not in ("http", "https"):
            raise HttpFailure(f"{request.method} {shown_url}: only http and https URLs are called.")
        late = f"{request.method} {shown_url}: no whole answer within {timeout:g} s (timeout_seconds)."
        try:
            # httpx's timeout bounds each connect, write and read; a server sending a
            # byte every few seconds would never trip it. `timeout_seconds` is the whole
            # exchange's bound (SPEC §15b): connect, send, redirects and every read.
            async with asyncio.timeout(timeout):
                return await self._exchange(built, request, shown_url, hide, secrets)
        except (TimeoutError, httpx.TimeoutException):
            raise HttpFailure(late) from None

    async def _exchange(self, built: httpx.Request, request: HttpRequest, shown_url: str, hide: Any,
                        secrets: tuple[str, ...]) -> dict[str, Any]:
        try:
            response = await self._client.send(built, stream=True)
        except httpx.TimeoutException:
            raise  # `call` says so
        except httpx.TooManyRedirects:
            raise HttpFailure(f"{request.method} {shown_url}: more than {MAX_REDIRECTS} redirects.") from None
        except SecretRefused as refused:
            raise HttpFailure(f"{request.method} {shown_url}: {hide(refused.message)}") from None
        except (httpx.HTTPError, OSError) as exc:
            refused = find_refusal(exc)
            if refused is not None:
                raise HttpFailure(f"{request.method} {shown_url}: {hide(str(refused))}") from None
            raise HttpFailure(f"{request.method} {shown_url}: {hide(_reason(exc))}") from None
        try:
            content = await self._read(response, request, shown_url)
        finally:
            await response.aclose()
        headers: dict[str, str] = {}
        for name, value in response.headers.multi_items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        body = _body(content, headers.get("content-type", ""), response.encoding)
        answer = {"status": response.status_code, "headers": headers, "body": body}
        if secrets:
            answer = redaction.scrub(answer, secrets)
        if response.status_code >= 400:
            raise HttpFailure(
                f"{request.method} {hide(str(response.url))} answered HTTP {response.status_code}"
                + _quoted(answer["body"]),
                retry_after=retry_after(headers.get("retry-after")) if response.status_code in (429, 503) else None,
            )
        return answer

    async def _read(self, response: httpx.Response, request: HttpRequest, shown_url: str) -> bytes:
        limit = self.max_bytes
        declared = response.headers.get("content-length", "")
        too_large = f"{request.method} {shown_url}: the answer is larger than {limit} bytes (1 MiB)."
        if declared.isdigit() and int(declared) > limit:
            raise HttpFailure(too_large)
        chunks, size = [], 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise HttpFailure(too_large)
                chunks.append(chunk)
        except httpx.TimeoutException:
            raise  # `call` says so
        except httpx.HTTPError as exc:
            raise HttpFailure(f"{request.method} {shown_url}: the answer broke off ({_reason(exc)}).") from None
        return b"".join(chunks)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


def _body(content: bytes, content_type: str, encoding: str | None) -> Any:
    """The parsed JSON of a JSON answer (its text when it does not parse), else the text."""
    media = content_type.split(";")[0].strip().lower()
    text = content.decode(encoding or "utf-8", errors="replace")
    if media == "application/json" or media.endswith("+json"):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _quoted(body: Any) -> str:
    if body in (None, ""):
        return "."
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    text = " ".join(text.split())
    return ": " + (text if len(text) <= _SHOWN_BODY else text[:_SHOWN_BODY] + "…")


def retry_after(value: str | None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, min(when.timestamp() - time.time(), RETRY_AFTER_MAX))
