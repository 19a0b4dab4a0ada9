"""HTTP client for the CLI and scripts: bearer auth, transparent refresh, SSE with resume.

`Client` wraps a synchronous `httpx.Client`. A 401 `TokenExpiredError` is answered by
one `POST /auth/refresh` with the refresh token it holds (then `on_tokens` is told the
new pair, so the CLI can keep it) and the request is sent again. Error bodies become
`APIError` (an `OrchestraError` carrying the server's status, name and message);
a server that cannot be reached becomes `ServerUnreachableError`.

`Client.events(trace_id)` reads a run's SSE stream. When the connection drops it
reconnects with `Last-Event-ID` set to the last `seq` it yielded, so the caller sees
every event once, in order; it stops after a terminal event or on a 204.
"""

from __future__ import annotations

import json
import mimetypes
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote

import httpx
from httpx_sse import EventSource, SSEError

from orchestra.backoff import Backoff
from orchestra.errors import OrchestraError
from orchestra.vocabulary import TERMINAL

API = "/api/v1"
TERMINAL_EVENTS = TERMINAL
CREDENTIALS_FILE = "credentials.json"
UPLOADS = "/adapter/client/upload"
REFRESH_TRIES = 3


class APIError(OrchestraError):
    """An error answer from the server (SPEC §1 body), or a non-JSON one."""

    def __init__(self, status: int, error: str, message: str, detail: Any = None) -> None:
        super().__init__(message, detail=detail)
        self.status = status
        self.error = error

    @classmethod
    def from_response(cls, response: httpx.Response) -> APIError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            error = body.get("error") or f"HTTP{response.status_code}"
            return cls(response.status_code, str(error), body["message"], body.get("detail"))
        text = (response.text or "").strip().splitlines()
        summary = text[0][:200] if text else response.reason_phrase
        return cls(response.status_code, f"HTTP{response.status_code}",
                   f"the server answered {response.status_code}: {summary}")


class ServerUnreachableError(OrchestraError):
    """No answer from the server: refused, timed out or the connection broke."""

    status, error = 503, "ServerUnreachableError"


class StreamGaveUpError(ServerUnreachableError):
    """The event stream could not be resumed within the reconnect budget."""


# --- credentials kept by `orchestra login` ---------------------------------------------


@dataclass
class Credentials:
    """What `orchestra login` keeps: the server URL and the token pair."""

    server: str
    access_token: str
    refresh_token: str | None = None
    user_name: str | None = None
    saved_at: float = field(default_factory=time.time)


def credentials_path(home: Path | str | None = None) -> Path:
    """`$ORCHESTRA_HOME/credentials.json` (default home `~/.orchestra`)."""
    base = home or os.environ.get("ORCHESTRA_HOME") or Path.home() / ".orchestra"
    return Path(base).expanduser() / CREDENTIALS_FILE


def load_credentials(path: Path) -> Credentials | None:
    """The kept credentials, or None when there are none (or the file is unreadable)."""
    try:
        data = json.loads(path.read_text())
        return Credentials(**{k: data[k] for k in data if k in Credentials.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def save_credentials(path: Path, credentials: Credentials) -> None:
    """Write atomically; the file is created with mode 0600 and never widened."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old leftover file keeps its mode otherwise
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(credentials), handle, indent=2)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def delete_credentials(path: Path) -> bool:
    """Remove the kept credentials; True when there were some."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


# --- events ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One SSE event of a run: `seq` (the SSE id), `kind` (the SSE event), `data`."""

    seq: int
    kind: str
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL_EVENTS

    def to_json(self) -> dict[str, Any]:
        """The raw event as one JSON object: `{"id", "event", "data"}` as on the wire."""
        return {"id": self.seq, "event": self.kind, "data": self.data}


# --- the client ------------------------------------------------------------------------


class Client:
    """A session with one orchestra server. Use as a context manager."""

    def __init__(
        self,
        server: str,
        *,
        access_token: str | None = None,
        refresh_token: str | None = None,
        on_tokens: Callable[[str, str], None] | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = normalise_server(server)
        self.access_token = access_token
        self.refresh_token = refresh_token
        self.on_tokens = on_tokens
        self.http = httpx.Client(
            base_url=self.server + API, timeout=timeout, transport=transport,
            headers={"User-Agent": "orchestra-cli"},
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- plain requests -----------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token}"} if self.access_token else {}

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.http.request(method, path, headers=self._headers(), **kwargs)
        except httpx.TimeoutException:
            raise ServerUnreachableError(f"the server at {self.server} did not answer in time") from None
        except httpx.TransportError as exc:
            raise ServerUnreachableError(f"cannot reach the server at {self.server}: {_reason(exc)}") from None

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """Send a request; the JSON body on 2xx, `{}` on 204, `APIError` otherwise.

        An expired access token is refreshed and the request sent again, up to
        REFRESH_TRIES times: `exp` has whole seconds, so a fresh token with a short
        lifetime may already be over by the time the retry arrives."""
        response = self._send(method, path, **kwargs)
        for _ in range(REFRESH_TRIES):
            if not self._expired(response):
                break
            response = self._send(method, path, **kwargs)
        return self._body(response)

    def get(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("GET", path, **kwargs)

    def get_all(self, path: str, key: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every item of a paged list (`GET path`, items under `key`), following
        `next_cursor` from page to page."""
        items: list[dict[str, Any]] = []
        params = {**(params or {}), "limit": 1000}
        while True:
            page = self.get(path, params=params)
            items += page.get(key, [])
            if not page.get("next_cursor"):
                return items
            params["cursor"] = page["next_cursor"]

    def post(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("DELETE", path, **kwargs)

    # -- uploads ------------------------------------------------------------------------
    def upload(self, paths: list[Path]) -> list[dict[str, Any]]:
        """`POST /adapter/client/upload` with every file as a `file` part; the files' records."""
        handles = [path.open("rb") for path in paths]
        try:
            parts = [("file", (path.name, handle, mimetypes.guess_type(path.name)[0]
                               or "application/octet-stream"))
                     for path, handle in zip(paths, handles, strict=True)]

            def send() -> httpx.Response:
                for handle in handles:  # a retry after a refresh sends the files again
                    handle.seek(0)
                return self._send("POST", UPLOADS, files=parts)

            response = send()
            if self._expired(response):
                response = send()
            return self._body(response).get("files", [])
        finally:
            for handle in handles:
                handle.close()

    def download(self, file_id: str, write: Callable[[str], BinaryIO]) -> tuple[str, int]:
        """Stream one upload into the handle `write(filename)` opens; (filename, bytes)."""
        for attempt in (1, 2):
            try:
                with self.http.stream("GET", f"{UPLOADS}/{file_id}", headers=self._headers()) as response:
                    if response.status_code >= 400:
                        response.read()
                        if attempt == 1 and self._expired(response):
                            continue
                        raise APIError.from_response(response)
                    name = filename_of(response.headers.get("content-disposition", "")) or file_id
                    size = 0
                    with write(name) as handle:
                        for chunk in response.iter_bytes():
                            handle.write(chunk)
                            size += len(chunk)
                    return name, size
            except httpx.TransportError as exc:
                raise ServerUnreachableError(f"cannot reach the server at {self.server}: {_reason(exc)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _body(response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            raise APIError.from_response(response)
        if response.status_code == 204 or not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise APIError(response.status_code, "BadResponse",
                           "the server's answer is not JSON; is --server an orchestra server?") from None

    def _expired(self, response: httpx.Response) -> bool:
        """On a 401 TokenExpiredError, refresh the pair; True when the caller should retry."""
        if response.status_code != 401 or not self.refresh_token:
            return False
        try:
            name = response.json().get("error")
        except (ValueError, AttributeError):
            return False
        if name != "TokenExpiredError":
            return False
        self.refresh()
        return True

    def refresh(self) -> None:
        """Exchange the refresh token for a new pair (and tell `on_tokens`)."""
        try:
            response = self.http.post("/auth/refresh", json={"refresh_token": self.refresh_token})
        except httpx.TransportError as exc:
            raise ServerUnreachableError(f"cannot reach the server at {self.server}: {_reason(exc)}") from None
        if response.status_code >= 400:
            error = APIError.from_response(response)
            error.message = f"the session has ended ({error.message}); run 'orchestra login' again"
            raise error
        body = self._body(response)
        self.access_token, self.refresh_token = body["access_token"], body["refresh_token"]
        if self.on_tokens:
            self.on_tokens(self.access_token, self.refresh_token)

    def login(self, user_name: str, password: str) -> dict[str, Any]:
        """`POST /auth/login`; keeps the pair on the client and returns the body."""
        body = self.post("/auth/login", json={"user_name": user_name, "password": password})
        self.access_token, self.refresh_token = body["access_token"], body["refresh_token"]
        return body

    # -- workflows ----------------------------------------------------------------------
    def start_run(self, template_id: str, input: Any = None, files: list[str] | None = None,
                  *, version: int | None = None, budget_usd: str | None = None) -> str:
        body: dict[str, Any] = {"template_id": template_id}
        if input is not None:
            body["input"] = input
        if files:
            body["files"] = files
        if version is not None:
            body["version"] = version
        if budget_usd is not None:
            body["budget_usd"] = budget_usd
        return self.post("/workflow/run", json=body)["trace_id"]

    def reply(self, trace_id: str, content: Any, request_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"content": content}
        if request_id:
            body["request_id"] = request_id
        return self.post(f"/workflow/reply/{trace_id}", json=body)

    def events(
        self,
        trace_id: str,
        *,
        last_event_id: int | None = None,
        max_retries: int = 8,
        retry_delay: float = 0.25,
        read_timeout: float = 60.0,
    ) -> Iterator[Event]:
        """The run's events after `last_event_id`, live, resuming across dropped connections.

        Ends after a terminal event, or when the server answers 204 (nothing more will
        come). Events with a `seq` not above the last one yielded are skipped, so a
        resume never repeats one. A server that cannot be reached at the first attempt
        is `ServerUnreachableError` at once; once connected, gives up with
        `StreamGaveUpError` after `max_retries` failed reconnects in a row.
        """
        state = _Resume(last=last_event_id, delay=retry_delay)
        connected = False  # a server that was never reached is an error at once
        while True:
            headers = {**self._headers(), "Accept": "text/event-stream", "Cache-Control": "no-store"}
            if state.last is not None:
                headers["Last-Event-ID"] = str(state.last)
            timeout = httpx.Timeout(self.http.timeout.connect or 10.0, read=read_timeout)
            try:
                with self.http.stream("GET", f"/workflow/sse/{trace_id}", headers=headers,
                                      timeout=timeout) as response:
                    connected = True
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        response.read()
                        if self._expired(response):
                            continue
                        raise APIError.from_response(response)
                    yield from _read_events(response, state)
                    if state.ended:
                        return
            except (httpx.TransportError, SSEError) as exc:  # dropped, refused, timed out
                if not connected:
                    raise ServerUnreachableError(
                        f"cannot reach the server at {self.server}: {_reason(exc)}") from None
                reason = _reason(exc)
            else:
                if state.planned_end:  # the server's stream deadline: resume at once, no failure
                    time.sleep(state.delay)
                    continue
                reason = "the stream ended before the run did"
            state.failures += 1
            if state.failures > max_retries:
                raise StreamGaveUpError(
                    f"lost the event stream of {trace_id} ({reason}) and could not resume it"
                )
            time.sleep(Backoff(base=state.delay, cap=5.0).delay(state.failures))


@dataclass
class _Resume:
    """Where an event stream is, across its reconnects."""

    last: int | None  # the last seq yielded
    delay: float  # the server's retry hint (seconds), the base of the backoff
    failures: int = 0  # failed reconnects in a row
    planned_end: bool = False  # this connection ended at the server's stream deadline
    ended: bool = False  # a terminal event was yielded


def _read_events(response: httpx.Response, state: _Resume) -> Iterator[Event]:
    """One connection's events not yielded before; stops after a terminal one."""
    state.planned_end = False
    for sse in EventSource(response).iter_sse():
        if sse.retry is not None:
            state.delay = max(sse.retry / 1000.0, 0.0)
            # a data-less retry: the server's stream deadline, a planned end
            state.planned_end = not sse.data
            if state.planned_end:
                continue
        event = _event(sse.id, sse.event, sse.data)
        if event is None or (state.last is not None and event.seq <= state.last):
            continue
        state.last = event.seq
        state.failures = 0
        yield event
        if event.terminal:
            state.ended = True
            return


def _event(sse_id: str, kind: str, data: str) -> Event | None:
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        payload = {"raw": data}
    if not isinstance(payload, dict):
        payload = {"value": payload}
    seq = payload.get("seq", sse_id)
    try:
        seq = int(sse_id) if sse_id else int(seq)
    except (TypeError, ValueError):
        return None
    return Event(seq=seq, kind=kind or payload.get("kind") or "message", data=payload)


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    if isinstance(exc, httpx.ConnectError):
        return "connection refused" if "refused" in text.lower() or not text else text
    return text or type(exc).__name__


def filename_of(disposition: str) -> str | None:
    """The file name of a `Content-Disposition` header (RFC 6266 `filename*` first), as a
    bare name: never a path, so a download cannot write outside the folder asked for."""
    plain = None
    for part in disposition.split(";"):
        key, _, value = part.strip().partition("=")
        key, value = key.strip().lower(), value.strip()
        if key == "filename*" and value.lower().startswith("utf-8''"):
            return _bare(unquote(value[7:]))
        if key == "filename":
            plain = value.strip('"')
    return _bare(plain) if plain else None


def _bare(name: str) -> str | None:
    base = Path(name.replace("\\", "/")).name
    return base if base not in ("", ".", "..") else None


def normalise_server(server: str) -> str:
    """`localhost:8000` → `http://localhost:8000`; no trailing slash, no `/api/v1`."""
    value = server.strip().rstrip("/")
    if not value:
        raise ValueError("the server URL is empty")
    if "://" not in value:
        value = "http://" + value
    if value.endswith(API):
        value = value[: -len(API)]
    return value
