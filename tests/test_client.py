"""orchestra.client against real servers: refresh, error mapping, credentials, SSE resume."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestra.client import (
    APIError,
    Client,
    Credentials,
    ServerUnreachableError,
    StreamGaveUpError,
    load_credentials,
    normalise_server,
    save_credentials,
)
from tests.conftest import ServerProcess, free_port

PASSWORD = "password-123"


def make_user(server: ServerProcess, name: str, role: str = "SUPER_ADMINISTRATOR") -> None:
    done = server.cli("user", "create", name, "--role", role, "--password-stdin", input=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr


def test_expired_access_token_is_refreshed_transparently(server):
    make_user(server, "root")
    kept: list[tuple[str, str]] = []
    with Client(server.base_url, on_tokens=lambda a, r: kept.append((a, r))) as client:
        client.login("root", PASSWORD)
        first_refresh = client.refresh_token
        client.access_token = first_access = server.expired(client.access_token)
        users = client.get("/auth/list")["users"]
    assert [u["user_name"] for u in users] == ["root"]
    assert len(kept) == 1
    assert kept[0] == (client.access_token, client.refresh_token)
    assert client.access_token != first_access and client.refresh_token != first_refresh


def test_expired_token_without_refresh_token_is_an_error(server):
    make_user(server, "root")
    with Client(server.base_url) as client:
        access = server.expired(client.login("root", PASSWORD)["access_token"])
    with Client(server.base_url, access_token=access) as client, pytest.raises(APIError) as caught:
        client.get("/auth/list")
    assert caught.value.status == 401 and caught.value.error == "TokenExpiredError"


def test_used_refresh_token_ends_the_session_with_a_readable_error(server):
    make_user(server, "root")
    with Client(server.base_url) as client:
        client.login("root", PASSWORD)
        stale = client.refresh_token
        client.refresh()  # rotates: `stale` is now used
    expired = server.expired(client.access_token)
    with (
        Client(server.base_url, access_token=expired, refresh_token=stale) as again,
        pytest.raises(APIError) as caught,
    ):
        again.get("/auth/list")
    assert caught.value.error == "TokenInvalidError"
    assert "orchestra login" in caught.value.message


def test_error_body_becomes_api_error(server):
    make_user(server, "root")
    with Client(server.base_url) as client:
        with pytest.raises(APIError) as wrong:
            client.login("root", "not-the-password")
        with pytest.raises(APIError) as unknown:
            client.login("nobody", PASSWORD)
        with pytest.raises(APIError) as anonymous:
            client.get("/auth/list")
    assert (wrong.value.status, wrong.value.error) == (401, "InvalidCredentialsError")
    assert (unknown.value.status, unknown.value.error) == (404, "UserNotExistError")
    assert (anonymous.value.status, anonymous.value.error) == (401, "AuthenticationRequiredError")
    assert anonymous.value.message


def test_server_down_is_server_unreachable():
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url) as client:
        with pytest.raises(ServerUnreachableError) as caught:
            client.get("/auth/list")
        with pytest.raises(ServerUnreachableError):
            list(client.events("some-trace", max_retries=1, retry_delay=0.01))
    assert url in caught.value.message and "refused" in caught.value.message


def test_credentials_file_is_0600_even_over_a_wider_file(tmp_path):
    path = tmp_path / "home" / "credentials.json"
    path.parent.mkdir()
    path.write_text("{}")
    os.chmod(path, 0o644)
    save_credentials(path, Credentials(server="http://x:1", access_token="a", refresh_token="r"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_credentials(path).access_token == "a"
    assert json.loads(path.read_text())["refresh_token"] == "r"
    assert [p.name for p in path.parent.iterdir()] == ["credentials.json"]  # no temp file left


def test_unreadable_credentials_are_treated_as_none(tmp_path):
    path = tmp_path / "credentials.json"
    path.write_text("not json")
    assert load_credentials(path) is None
    assert load_credentials(tmp_path / "missing.json") is None


@pytest.mark.parametrize("given, expected", [
    ("localhost:8000", "http://localhost:8000"),
    ("http://h:1/", "http://h:1"),
    ("https://h/api/v1", "https://h"),
])
def test_normalise_server(given, expected):
    assert normalise_server(given) == expected


# --- the SSE reader against a scripted event server --------------------------------------


class _Script:
    """What a tiny SSE server sends per connection, and what it was asked."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.last_event_ids: list[str | None] = []


def _sse_server(script: _Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            script.last_event_ids.append(self.headers.get("Last-Event-ID"))
            answer = script.answers.pop(0)
            if answer == 204:
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            events, cut = answer
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for seq, kind in events:
                data = json.dumps({"trace_id": "t", "seq": seq, "ts": seq / 10})
                self.wfile.write(f"id: {seq}\nevent: {kind}\ndata: {data}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b": ping\n\n")
            if cut:
                self.wfile.write(b"id: 99\nevent: tok")  # half an event, then the line dies
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_sse_reader_resumes_with_last_event_id_skipping_duplicates():
    script = _Script([
        ([(1, "run_started"), (2, "step_started"), (3, "token")], True),
        ([(3, "token"), (4, "step_finished"), (5, "run_finished")], False),
    ])
    httpd = _sse_server(script)
    try:
        with Client(f"http://127.0.0.1:{httpd.server_port}") as client:
            events = list(client.events("t", retry_delay=0.01))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.kind for e in events][-1] == "run_finished"
    assert script.last_event_ids == [None, "3"]


def test_sse_reader_stops_on_204_and_gives_up_after_retries():
    script = _Script([([(7, "token")], True), 204])
    httpd = _sse_server(script)
    try:
        with Client(f"http://127.0.0.1:{httpd.server_port}") as client:
            assert [e.seq for e in client.events("t", last_event_id=6, retry_delay=0.01)] == [7]
            assert script.last_event_ids == ["6", "7"]
            script.answers = [([], True)] * 3
            with pytest.raises(StreamGaveUpError):
                list(client.events("t", max_retries=2, retry_delay=0.01))
    finally:
        httpd.shutdown()
        httpd.server_close()


# --- the SSE reader against the real server, through a proxy that cuts connections -------


class CuttingProxy:
    """A loopback TCP proxy: the first `cuts` connections die after `cut_after` bytes of
    answer; later ones pass through. Records each request's Last-Event-ID header."""

    def __init__(self, upstream_port: int, *, cuts: int, cut_after: int) -> None:
        self.upstream_port, self.cuts, self.cut_after = upstream_port, cuts, cut_after
        self.last_event_ids: list[str | None] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            limit = self.cut_after if self.connections <= self.cuts else None
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, upstream, None, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, limit, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, limit: int | None, request: bool) -> None:
        sent = 0
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if request:
                    header = [line.split(b":", 1)[1].strip().decode() for line in data.split(b"\r\n")
                              if line.lower().startswith(b"last-event-id:")]
                    self.last_event_ids.append(header[0] if header else None)
                if limit is not None and sent + len(data) >= limit:
                    sink.sendall(data[: limit - sent])
                    break
                sink.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_sse_reader_resumes_a_live_run_without_gaps_or_duplicates(server):
    from tests.cli.cli_harness import setup_world
    from tests.fakes.fake_llm import FakeLLM

    with FakeLLM(chunk_delay=0.02) as llm:
        world = setup_world(server, llm.base_url)
        proxy = CuttingProxy(server.port, cuts=2, cut_after=1500)
        try:
            with Client(server.base_url, access_token=world["token"]) as direct:
                trace_id = direct.start_run(world["templates"]["three_step"]["template_id"],
                                            "a topic with several words in it")
            with Client(f"http://127.0.0.1:{proxy.port}", access_token=world["token"]) as client:
                events = list(client.events(trace_id, retry_delay=0.05))
        finally:
            proxy.close()
        with Client(server.base_url, access_token=world["token"]) as direct:
            stored = direct.get(f"/workflow/run/{trace_id}/events")["events"]

    assert proxy.connections == 3
    assert proxy.last_event_ids[0] is None
    resumed_at = [int(x) for x in proxy.last_event_ids[1:]]
    assert len(resumed_at) == 2 and 0 < resumed_at[0] < resumed_at[1] < len(stored)
    assert [e.seq for e in events] == list(range(1, len(stored) + 1))
    assert [(e.seq, e.kind, e.data) for e in events] == [(s["seq"], s["kind"], s["data"]) for s in stored]
    assert events[-1].kind == "run_finished"
