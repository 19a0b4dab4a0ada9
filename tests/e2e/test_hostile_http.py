"""Hostile and careless clients at the HTTP edge, against a real `orchestra serve` process.

HEAD on every GET route (the route list is walked, so a new route cannot escape); a
request head trickled in byte by byte is cut off at the head deadline while others are
served; oversized heads are 431; bodies that are not strict UTF-8 JSON are 400 with a
plain sentence (login included, no token); a token whose claims have the wrong types is
401 every time; running out of file descriptors is 503; two message/parsing defects.
Store-backed cases run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import re
import resource
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import jwt
import pytest

from orchestra.engine.llm.factory import SUPPORTED_KINDS
from orchestra.settings import Settings
from orchestra.web.app import create_app
from tests.conftest import ServerProcess

PASSWORD = "password-123"
HEADER_TIMEOUT = 2.0
SECRET = "e2e-secret-" + "y" * 32  # what ServerProcess gives the server


def start_server(home: Path, database_url: str | None = None, **env: str) -> ServerProcess:
    settings = {"ORCHESTRA_HEADER_TIMEOUT": str(HEADER_TIMEOUT), **env}
    return ServerProcess(home, database_url=database_url, env=settings).start()


@pytest.fixture
def any_server(both_stores, tmp_path):
    """A server on SQLite or on a fresh PostgreSQL database."""
    server = start_server(tmp_path / "home", both_stores)
    yield server
    server.stop()


@pytest.fixture
def sqlite_server(tmp_path):
    server = start_server(tmp_path / "home")
    yield server
    server.stop()


def login(server: ServerProcess, name: str, role: str = "USER") -> dict:
    made = server.cli("user", "create", name, "--role", role, "--password-stdin", input=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr
    answer = httpx.post(f"{server.base_url}/api/v1/auth/login", json={"user_name": name, "password": PASSWORD})
    assert answer.status_code == 200, answer.text
    token = answer.json()["access_token"]
    return {"headers": {"Authorization": f"Bearer {token}"}, "claims": jwt.decode(token, options={"verify_signature": False})}


def assert_error(response: httpx.Response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and isinstance(body["message"], str) and body["message"], body
    return body


def raw_exchange(server: ServerProcess, data: bytes, wait: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


# --- HEAD ---------------------------------------------------------------------------


def _routes() -> list[tuple[str, frozenset[str]]]:
    """(path, methods) of every route of the app, read from its router."""
    app = create_app(Settings.from_env(env={}, home=Path("/nonexistent"), secret_key="k" * 40))
    paths: dict[str, set[str]] = {}
    for route in app.router.routes:
        paths.setdefault("/" + route.path.lstrip("/"), set()).update(route.methods)
    return [(path, frozenset(methods)) for path, methods in sorted(paths.items())]


def _fill(path: str, ids: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1).split(":")[0]
        assert name in ids, f"no test value for the route parameter <{name}> of {path}: add one"
        return ids[name]

    return re.sub(r"<([^>]+)>", one, path)


def _comparable(headers: httpx.Headers) -> dict[str, str]:
    """The headers HEAD must share with GET: all but the per-connection ones and the
    request id and MCP session id, new for every request (their presence is still
    compared)."""
    kept = {k: v for k, v in headers.items() if k not in {"connection", "keep-alive"}}
    for fresh in ("x-request-id", "mcp-session-id"):
        if fresh in kept:
            kept[fresh] = "<present>"
    return kept


def _get_head(http: httpx.Client, url: str) -> tuple[httpx.Response, httpx.Response]:
    """GET (its head only, for a stream that may never end) and HEAD of one URL."""
    with http.stream("GET", url) as got:
        pass
    started = time.monotonic()
    head = http.head(url)
    assert time.monotonic() - started < 5, f"HEAD {url} took a stream's time"
    return got, head


def _world(server: ServerProcess) -> tuple[httpx.Client, dict[str, str]]:
    """An administrator and one of each resource a GET route can name."""
    admin = login(server, "head_admin", "SUPER_ADMINISTRATOR")
    http = httpx.Client(base_url=server.base_url, headers=admin["headers"], timeout=15)
    api = "/api/v1"
    provider = http.post(f"{api}/provider", json={"name": "p", "provider": "openai_compatible",
                                                   "model_id": "m", "base_url": "http://127.0.0.1:9/v1"})
    assert provider.status_code == 201, provider.text
    worker = http.post(f"{api}/agent/worker", json={"name": "w", "provider_id": provider.json()["provider_id"],
                                                    "tools": ["calculator"]})
    assert worker.status_code == 201, worker.text
    skill = http.post(f"{api}/resource/skill", json={"name": "s", "instructions": "be brief"})
    assert skill.status_code == 201, skill.text
    steps = [{"id": "ask", "agent": {"human": True}, "prompt": "Well?"}]
    template = http.post(f"{api}/workflow/template", json={"name": "t", "steps": steps})
    assert template.status_code == 201, template.text
    run = http.post(f"{api}/workflow/run", json={"template_id": template.json()["template_id"]})
    assert run.status_code == 202, run.text
    upload = http.post(f"{api}/adapter/client/upload", files={"file": ("a.txt", b"hello head", "text/plain")})
    assert upload.status_code == 201, upload.text
    mcp = http.post(f"{api}/resource/mcp", json={"name": "m", "transport": "streamable_http",
                                                 "url": "http://127.0.0.1:9/mcp", "timeout_seconds": 2})
    assert mcp.status_code == 201, mcp.text
    template_id = template.json()["template_id"]
    schedule = http.post(f"{api}/workflow/schedule", json={"template_id": template_id, "cron": "0 0 1 1 *"})
    assert schedule.status_code == 201, schedule.text
    # a public address (no DNS, no delivery: the world's run never fails)
    subscription = http.post(f"{api}/workflow/subscription",
                             json={"url": "https://93.184.216.34/hook", "events": ["run.failed"]})
    assert subscription.status_code == 201, subscription.text
    hook = http.post(f"{api}/workflow/hook", json={"template_id": template_id})
    assert hook.status_code == 201, hook.text
    workspace = http.post(f"{api}/workspace", json={"name": "head team"})
    assert workspace.status_code == 201, workspace.text
    ids = {
        "workspace_id": workspace.json()["workspace_id"],
        "schedule_id": schedule.json()["schedule_id"],
        "subscription_id": subscription.json()["subscription_id"],
        "hook_id": hook.json()["hook_id"],
        "number": "1",
        "key_id": "no-such-key",  # only DELETE names a key: HEAD there is 405 whatever the id
        "delivery_id": "no-such-delivery",  # only POST …/retry names a delivery
        "provider_id": provider.json()["provider_id"],
        "worker_id": worker.json()["worker_id"],
        "skill_id": skill.json()["skill_id"],
        "template_id": template.json()["template_id"],
        "trace_id": run.json()["trace_id"],  # waiting for a reply: its stream stays open
        "file_id": upload.json()["files"][0]["file_id"],
        "server_id": mcp.json()["server_id"],
        "name": "planner",
        "user_id": admin["claims"]["sub"],
        "relative": "console.css",  # the web console's files
        "asset": "swagger-ui.css",  # the docs pages' vendored files
    }
    return http, ids


def test_head_on_every_get_route_answers_as_get_without_a_body(any_server):
    http, ids = _world(any_server)
    unknown = {name: "no-such-" + uuid.uuid4().hex[:8] for name in ids}
    routes = _routes()
    with_get = [path for path, methods in routes if "GET" in methods]
    assert "/api/v1/workflow/sse/<trace_id:str>" in with_get and len(with_get) >= 20
    anonymous = httpx.Client(base_url=any_server.base_url, timeout=15)
    for path in with_get:
        for client, values in ((http, ids), (http, unknown), (anonymous, ids)):
            url = _fill(path, values)
            got, head = _get_head(client, url)
            if client is http and values is ids and path != "/mcp":
                # every route's success path is reached (an MCP GET needs a session of the
                # MCP protocol's handshake era: without one it is 400, as the protocol says)
                assert got.status_code == 200, (url, got.status_code)
            assert head.status_code == got.status_code, (url, got.status_code, head.status_code, head.text)
            assert head.content == b"", url
            assert _comparable(head.headers) == _comparable(got.headers), url

    sse = _fill("/api/v1/workflow/sse/<trace_id:str>", ids)
    head = http.head(sse)
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")
    assert head.headers["transfer-encoding"] == "chunked" and "content-length" not in head.headers
    download = http.head(_fill("/api/v1/adapter/client/upload/<file_id:str>", ids))
    assert download.headers["content-length"] == str(len(b"hello head"))

    # Routes without GET: HEAD is 405 with an Allow header, never a crash.
    for path, methods in routes:
        if "GET" in methods:
            continue
        head = http.head(_fill(path, ids))
        assert head.status_code == 405 and head.content == b"", path
        allowed = {m.strip() for m in head.headers["allow"].split(",")}
        assert methods <= allowed and "HEAD" not in allowed, (path, allowed)

    # The store is still writable and nothing crashed (the old HEAD left a transaction open).
    template = http.get("/api/v1/workflow/template").json()["templates"][0]["template_id"]
    assert http.post("/api/v1/workflow/run", json={"template_id": template}).status_code == 202
    log = any_server.log_path.read_text()
    assert "TypeError" not in log and "database is locked" not in log, log[-3000:]
    unhandled = re.findall(r"unhandled error on (\S+ \S+)", log)
    assert unhandled == [], unhandled


# --- the request head: deadline and limits ----------------------------------------------


def test_a_trickled_head_is_cut_off_at_the_deadline_while_others_are_served(sqlite_server):
    server = sqlite_server
    ended: dict = {}

    def trickle() -> None:
        head = b"GET /api/v1/auth/list HTTP/1.1\r\nHost: slow\r\nX-Slow: " + b"a" * 60
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        started = time.monotonic()
        answer = b""
        try:
            for byte in head:
                sock.send(bytes([byte]))
                sock.settimeout(1.0)  # one byte a second, reading whatever comes back
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                answer += chunk
                if not chunk:
                    break
                while chunk := sock.recv(65536):
                    answer += chunk
                break
        except OSError:
            pass
        ended.update(after=time.monotonic() - started, answer=answer)
        sock.close()

    slow = threading.Thread(target=trickle)
    slow.start()
    served = []
    with httpx.Client(base_url=server.base_url, timeout=5) as normal:
        while slow.is_alive() and len(served) < 200:
            started = time.monotonic()
            answer = normal.post("/api/v1/auth/login", json={"user_name": "nobody", "password": PASSWORD})
            served.append((answer.status_code, time.monotonic() - started))
            time.sleep(0.1)
    slow.join(30)
    assert ended["after"] <= HEADER_TIMEOUT + 2, ended
    status, headers, body = parse_answer(ended["answer"])
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"] == "RequestTimeoutError"
    assert len(served) >= 5 and all(code == 404 for code, _ in served)
    assert max(seconds for _, seconds in served) < 1.0, served


@pytest.mark.parametrize(
    "head",
    [
        b"X-Big: " + b"a" * 10 * 1024 + b"\r\n",  # one 10 KB header
        b"".join(b"X-Many-%d: 1\r\n" % i for i in range(2000)),  # 2,000 headers
        b"".join(b"X-N-%d: 1\r\n" % i for i in range(150)),  # many small ones, a small head
    ],
    ids=["one-10KB-header", "2000-headers", "150-headers"],
)
def test_oversized_request_heads_are_431(sqlite_server, head):
    request = b"GET /api/v1/auth/list HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n"
    status, headers, body = parse_answer(raw_exchange(sqlite_server, request))
    assert status == 431 and headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["error"] == "RequestHeaderFieldsTooLargeError" and "body" not in answer["message"]
    # A head just inside the limits is served.
    fine = b"GET /api/v1/auth/list HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Fine: " + b"a" * 4000 + b"\r\n\r\n"
    assert parse_answer(raw_exchange(sqlite_server, fine))[0] == 401


def test_a_malformed_head_is_400_with_a_sentence(sqlite_server):
    for request in (b"GET /api/v1/auth/list HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
                    b"GET /api/v1/auth/list HTTP/2.0\r\nHost: x\r\n\r\n"):
        status, headers, body = parse_answer(raw_exchange(sqlite_server, request))
        assert status == 400 and headers["connection"] == "close"
        assert json.loads(body) == {"message": "The request is not well-formed HTTP/1.1.",
                                    "error": "BadRequestError"}


# --- strict JSON bodies -----------------------------------------------------------------

BAD_BODIES = {
    "100,000 levels deep": (b"[" * 100_000 + b"]" * 100_000, "nests arrays and objects deeper than 64 levels"),
    "65 levels deep": (b'{"user_name":' + b"[" * 64 + b"]" * 64 + b"}", "deeper than 64 levels"),
    "unclosed 1,000,000 deep": (b"[" * 1_000_000, "deeper than 64 levels"),
    "NaN": (b'{"user_name": "a", "password": NaN}', "contains NaN"),
    "Infinity": (b'{"user_name": "a", "password": Infinity}', "contains Infinity"),
    "-Infinity": (b'{"user_name": "a", "password": -Infinity}', "contains -Infinity"),
    "duplicate key": (b'{"user_name": "a", "user_name": "b"}', 'the key "user_name" twice'),
    "5,000-digit integer": (b'{"user_name": ' + b"7" * 5000 + b"}", "number longer than 100 characters"),
    "101-character number": (b'{"n": 0.' + b"1" * 99 + b"}", "number longer than 100 characters"),
    "number past a double": (b'{"n": 1e400}', "number too large"),
    "byte order mark": (b'\xef\xbb\xbf{"user_name": "a"}', "byte order mark"),
    "UTF-16": ('{"user_name": "a"}'.encode("utf-16"), "UTF-16 or UTF-32"),
    "UTF-16 without BOM": ('{"user_name": "a"}'.encode("utf-16-le"), "UTF-16 or UTF-32"),
    "UTF-32": ('{"user_name": "a"}'.encode("utf-32"), "UTF-16 or UTF-32"),
    "Latin-1": ('{"user_name": "zoë"}'.encode("latin-1"), "not valid UTF-8"),
    "syntax": (b'{"user_name": "a",}', "not valid JSON (line 1, column"),
}


def test_bodies_that_are_not_strict_json_are_400_with_a_plain_sentence(any_server):
    admin = login(any_server, "body_admin", "ADMINISTRATOR")
    routes = [
        ("/api/v1/auth/login", {}),  # no token needed
        ("/api/v1/auth/register", {}),
        ("/api/v1/resource/skill", admin["headers"]),
    ]
    with httpx.Client(base_url=any_server.base_url, timeout=30) as http:
        for case, (body, phrase) in BAD_BODIES.items():
            for path, headers in routes:
                answer = http.post(path, content=body, headers={**headers, "Content-Type": "application/json"})
                message = assert_error(answer, 400, "BadRequestError")["message"]
                assert phrase in message, (case, path, message)
                assert message.startswith("The request body") and message.endswith("."), message
                for python_text in ("Expecting", "Exceeds the limit", "sys.set_int_max_str_digits", "codec"):
                    assert python_text not in message, (case, message)
        # Strict does not mean fussy: what RFC 8259 allows still passes.
        fine = '{"name": "ok", "instructions": "\\ud83d\\ude00 \\\\ud800 [[[[", "description": "é"}'
        made = http.post("/api/v1/resource/skill", content=fine.encode(),
                         headers={**admin["headers"], "Content-Type": "application/json"})
        assert made.status_code == 201, made.text
        assert made.json()["instructions"] == "\U0001f600 \\ud800 [[[["
        # Half a surrogate pair is JSON text but names no character: a 422 for its field.
        lone = http.post("/api/v1/resource/skill", content=b'{"name": "s", "instructions": "\\ud800"}',
                         headers={**admin["headers"], "Content-Type": "application/json"})
        assert assert_error(lone, 422, "ValidationError")["detail"][0]["field"] == "instructions"
        deep_ok = {"name": "deep", "instructions": "x", "description": "y", "extra": json.loads("[" * 63 + "]" * 63)}
        assert http.post("/api/v1/resource/skill", json=deep_ok, headers=admin["headers"]).status_code == 201
    assert "Traceback" not in any_server.log_path.read_text()


# --- token claims -------------------------------------------------------------------------


def test_a_signed_token_with_claims_of_the_wrong_type_is_401_every_time(any_server):
    user = login(any_server, "claims_user")
    good = user["claims"]
    forged = {
        "exp as a string": {**good, "exp": str(good["exp"])},
        "iat as a string": {**good, "iat": str(good["iat"])},
        "exp as true": {**good, "exp": True},
        "nbf as a string": {**good, "nbf": "0"},
        "sub as a number": {**good, "sub": 12},
        "type as a list": {**good, "type": ["access"]},
    }
    with httpx.Client(base_url=any_server.base_url, timeout=15) as http:
        assert http.get("/api/v1/workflow/template", headers=user["headers"]).status_code == 200
        for case, claims in forged.items():
            token = jwt.encode(claims, SECRET, algorithm="HS256")
            for attempt in range(2):  # the second use meets the verified-token cache
                answer = http.get("/api/v1/workflow/template", headers={"Authorization": f"Bearer {token}"})
                assert_error(answer, 401, "TokenInvalidError")
                assert answer.status_code == 401, (case, attempt)


# --- out of file descriptors --------------------------------------------------------------


def test_running_out_of_file_descriptors_is_503_not_500(sqlite_server):
    server = sqlite_server
    user = login(server, "fd_user")
    http = httpx.Client(base_url=server.base_url, headers=user["headers"], timeout=15)
    upload = {"file": ("a.txt", b"x" * 100, "text/plain")}
    assert http.post("/api/v1/adapter/client/upload", files=upload).status_code == 201  # connection kept
    pid = server.proc.pid
    in_use = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 8, hard))
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
    try:
        time.sleep(0.5)  # the server accepts idle connections until no descriptor is left
        answer = http.post("/api/v1/adapter/client/upload", files=upload)
        body = assert_error(answer, 503, "OverloadedError")
        assert answer.headers["retry-after"] == "1" and "try again" in body["message"]
    finally:
        for sock in idle:
            sock.close()
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # descriptors come back: served again
        answer = http.post("/api/v1/adapter/client/upload", files=upload)
        if answer.status_code == 201:
            break
        time.sleep(0.5)
    assert answer.status_code == 201, answer.text
    http.close()


# --- item 9: two message and parsing defects ----------------------------------------------


def test_provider_kind_message_and_ascii_only_last_event_id(any_server):
    admin = login(any_server, "nine_admin", "ADMINISTRATOR")
    with httpx.Client(base_url=any_server.base_url + "/api/v1", headers=admin["headers"], timeout=15) as http:
        answer = http.post("/provider", json={"name": "g", "provider": "gemini", "model_id": "gemini-pro"})
        body = assert_error(answer, 422, "ValidationError")
        problem = f"unsupported provider kind 'gemini'; supported kinds: {', '.join(SUPPORTED_KINDS)}"
        assert body["detail"] == [{"field": "provider", "problem": problem}]
        assert body["message"] == f"Invalid request body: provider: {problem}."

        steps = [{"id": "ask", "agent": {"human": True}, "prompt": "Well?"}]
        template = http.post("/workflow/template", json={"name": "t9", "steps": steps}).json()["template_id"]
        trace = http.post("/workflow/run", json={"template_id": template}).json()["trace_id"]
        full_width_five = "\uff15".encode()  # "５": a digit to str.isdigit(), not an event id
        header = http.get(f"/workflow/sse/{trace}", headers={"Last-Event-ID": full_width_five})
        body = assert_error(header, 422, "ValidationError")
        assert body["detail"][0]["field"] == "Last-Event-ID"
        query = http.get(f"/workflow/sse/{trace}?last_event_id=%EF%BC%95")
        body = assert_error(query, 422, "ValidationError")
        assert body["detail"][0]["field"] == "last_event_id"
        for arabic_indic_five in ("\u0665", "\u00b2"):
            assert http.get(f"/workflow/sse/{trace}", params={"last_event_id": arabic_indic_five}).status_code == 422


def _trickle_body(server: ServerProcess, head: bytes, first: bytes) -> tuple[float, bytes]:
    """Send `head` and `first` at once, then one byte a second; (seconds lived, answer)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(head + first)
    started = time.monotonic()
    answer = b""
    sock.settimeout(1.0)
    while time.monotonic() - started < 15:
        try:
            sock.send(b"x")
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        answer += chunk
        if not chunk:
            break
    sock.close()
    return time.monotonic() - started, answer


def test_a_trickled_body_is_cut_off_below_the_minimum_rate(sqlite_server):
    """A head on time, then a body one byte a second: below ORCHESTRA_BODY_MIN_RATE (240)
    once the grace (the head's deadline, 2 s here) is over, the server answers 408 and closes — for a JSON body read
    before the handler and for an upload read by it."""
    server = sqlite_server
    token = login(server, "slow_body")["headers"]["Authorization"]
    json_head = (b"POST /api/v1/auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n")
    part = (b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.txt\"\r\n"
            b"Content-Type: text/plain\r\n\r\n")
    upload_head = (b"POST /api/v1/adapter/client/upload HTTP/1.1\r\nHost: x\r\nAuthorization: "
                   + token.encode() + b"\r\nContent-Type: multipart/form-data; boundary=b0undary\r\n"
                   b"Content-Length: 100000\r\n\r\n")
    with httpx.Client(base_url=server.base_url, timeout=5) as normal:
        for head, first in ((json_head, b'{"user_name": "'), (upload_head, part)):
            lived, answer = _trickle_body(server, head, first)
            assert HEADER_TIMEOUT - 0.5 < lived < HEADER_TIMEOUT + 2.5, lived
            status, headers, body = parse_answer(answer)
            assert status == 408 and headers["connection"] == "close", answer
            message = json.loads(body)
            assert message["error"] == "RequestTimeoutError" and "bytes a second" in message["message"]
            # Nothing of the slow upload is kept; the server serves others as before.
            listed = normal.get("/api/v1/adapter/client/upload", headers={"Authorization": token})
            assert listed.status_code == 200 and listed.json()["files"] == []
    assert not list((server.home / "uploads").rglob("*.part"))
