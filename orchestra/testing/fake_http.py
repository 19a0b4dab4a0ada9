"""A real HTTP server on loopback for HTTP-step tests and benchmarks (a thread of its own).

Routes: `/echo` answers JSON `{method, path, query, headers, body}` (header names in
lower case) and echoes every request header back as `x-echo-<name>`; `/status/<code>`
answers that status (`?retry_after=N` adds `Retry-After`); `/big/<n>` answers n bytes
(`?chunked=1`: in 64 KiB chunks, no Content-Length);
`/redirect?to=<url>` answers 302 to it; `/slow/<seconds>` waits, then answers;
`/cookie?set=<name=value>` answers 200 with that `Set-Cookie`;
`/drip/<n>?every=<seconds>` sends its head at once, then one body byte every `every`
seconds (0.5 by default), n bytes in all (a reader that bounds each read, not the whole
exchange, waits n × every); `/text` answers plain text. Every request is counted per path (`hits`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are two writes: no 40 ms delayed-ACK stall
    server: _Server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet
        return

    def _answer(self, status: int, body: bytes, content_type: str = "application/json",
                extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _chunked(self, size: int) -> None:
        """`size` bytes with no Content-Length: a reader learns the size only by reading."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while size > 0:
                part = min(size, 64 * 1024)
                self.wfile.write(b"%x\r\n%s\r\n" % (part, b"x" * part))
                size -= part
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the reader stopped at its limit and hung up
            self.close_connection = True

    def _drip(self, size: int, every: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        try:
            for _ in range(size):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(every)
        except OSError:  # the reader gave up and hung up
            self.close_connection = True

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with self.server.lock:
            self.server.hits[parts.path] += 1
            self.server.requests.append({"at": time.monotonic(), "method": self.command, "path": parts.path,
                                         "headers": {k.lower(): v for k, v in self.headers.items()},
                                         "body": body.decode("utf-8", "replace")})
        segments = parts.path.strip("/").split("/")
        if segments[0] == "echo":
            headers = {k.lower(): v for k, v in self.headers.items()}
            answer = {"method": self.command, "path": parts.path, "query": query, "headers": headers,
                      "body": body.decode("utf-8", "replace")}
            echoed = {f"x-echo-{k}": v for k, v in headers.items() if k not in ("content-length", "host")}
            self._answer(200, json.dumps(answer).encode(), extra=echoed)
        elif segments[0] == "status" and len(segments) > 1 and segments[1].isdigit():
            extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self._answer(int(segments[1]), json.dumps({"error": f"status {segments[1]}"}).encode(), extra=extra)
        elif segments[0] == "big" and len(segments) > 1 and segments[1].isdigit():
            if query.get("chunked"):
                self._chunked(int(segments[1]))
            else:
                self._answer(200, b"x" * int(segments[1]), "text/plain")
        elif segments[0] == "redirect":
            self._answer(302, b"", "text/plain", {"Location": query.get("to", "/echo")})
        elif segments[0] == "slow" and len(segments) > 1:
            time.sleep(float(segments[1]))
            self._answer(200, b'{"slow": true}')
        elif segments[0] == "drip" and len(segments) > 1 and segments[1].isdigit():
            self._drip(int(segments[1]), float(query.get("every", 0.5)))
        elif segments[0] == "cookie":
            self._answer(200, b'{"cookie": true}', extra={"Set-Cookie": query.get("set", "session=1") + "; Path=/"})
        elif segments[0] == "text":
            self._answer(200, "plain text ✓".encode(), "text/plain; charset=utf-8")
        else:
            self._answer(404, b'{"error": "no such route"}')

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address) -> None:
        super().__init__(address, _Handler)
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.requests: list[dict] = []

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (a reader past its size limit) is no error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeHttp:
    """`with FakeHttp() as target:` — `target.url` is `http://127.0.0.1:<port>`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = _Server((host, 0))
        self.host = host
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-http", daemon=True)

    def start(self) -> FakeHttp:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def hits(self) -> Counter[str]:
        with self._server.lock:
            return Counter(self._server.hits)

    @property
    def requests(self) -> list[dict]:
        with self._server.lock:
            return list(self._server.requests)

    def __enter__(self) -> FakeHttp:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m orchestra.testing.fake_http --port N`: serve until killed (benchmarks run
    it in a process of its own, so it shares no interpreter lock with what it measures)."""
    import argparse

    parser = argparse.ArgumentParser(description="A loopback HTTP server for HTTP-step tests.")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = _Server(("127.0.0.1", args.port))
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
