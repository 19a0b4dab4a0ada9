"""A receiving server for outbound webhooks in tests: a real HTTP server on loopback
that records every request (headers, body) and answers with scripted statuses (then
200), optionally after a delay."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: str
    at: float


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode()
        receiver = self.server.receiver
        with receiver.lock:
            receiver.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                              body, time.time()))
            status = receiver.statuses.pop(0) if receiver.statuses else 200
        if receiver.delay:
            time.sleep(receiver.delay)
        self.send_response(status)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: WebhookReceiver) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.receiver = receiver


class WebhookReceiver:
    """`with WebhookReceiver(statuses=[500, 500, 500]) as hook:` … `hook.url`, `hook.received`."""

    def __init__(self, statuses: list[int] | None = None, delay: float = 0.0) -> None:
        self.statuses = list(statuses or [])
        self.delay = delay
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> WebhookReceiver:
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.02)
        raise AssertionError(f"{len(self.received)} request(s) received, expected {count}")
