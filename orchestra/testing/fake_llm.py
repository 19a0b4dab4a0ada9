"""A scriptable fake OpenAI-compatible server, for tests, benchmarks and trying runs offline.

It is a real HTTP/1.1 server on loopback (standard library only, one thread per
connection) that streams genuine `data: {...}` SSE chunks with chunked transfer
encoding, so `OpenAICompatClient` (or any OpenAI SDK) runs against it unchanged.

Tests queue scripted replies (text, tool calls, HTTP errors, a stream cut mid-way;
`script_json` queues a chosen or wrong structured answer). With nothing queued it
answers from the request (`orchestra.testing.fake_answers`: echo or assistant mode,
structured output, and the `fake:` directives a prompt carries, `fake:fail=N` counted
here per distinct prompt). Every request is recorded. Run standalone with
`python -m orchestra.testing.fake_llm --port 9999` (`--help` lists the directives).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self

from orchestra.testing.fake_answers import (
    DIRECTIVES_HELP,
    Directives,
    count_words,
    last_user_text,
    unscripted_reply,
)
from orchestra.testing.fake_meter import TokenMeter, max_tokens_of, rate_limited_body, usage_counts
from orchestra.testing.fake_script import RecordedRequest, ScriptedReply, split_text

DEFAULT_MODELS = ("fake-model", "fake-model-large")
INVALID_KEY_ERROR = {
    "error": {
        "message": "Incorrect API key provided",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
        "param": None,
    }
}

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    # -- plumbing -------------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        # Each SSE chunk is its own small write: without TCP_NODELAY, Nagle holds the
        # second one until the client's delayed ACK (~40 ms on Linux) on every reply.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.fake._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.fake.verbose:
            super().log_message(format, *args)

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        content_type = "application/json" if not isinstance(payload, bytes) else "text/plain"
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _sse(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self._write_chunk(f"data: {data}\n\n".encode())

    def _authorised(self) -> bool:
        fake = self.server.fake
        header = self.headers.get("Authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if not key:
            error = {"error": {**INVALID_KEY_ERROR["error"], "message": "Missing API key"}}
            self._send_json(401, error)
            return False
        if key in fake.bad_keys or (fake.api_key is not None and key != fake.api_key):
            self._send_json(401, INVALID_KEY_ERROR)
            return False
        return True

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    # -- routes ---------------------------------------------------------------------
    def do_GET(self) -> None:
        self.server.fake._record(self.command, self.path, dict(self.headers), None, self.client_address[1])
        if self.path.rstrip("/") != "/v1/models":
            self._send_json(404, {"error": {"message": f"Unknown path {self.path}"}})
            return
        if not self._authorised():
            return
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "fake-llm"}
            for m in self.server.fake.models
        ]
        self._send_json(200, {"object": "list", "data": data})

    def do_POST(self) -> None:
        body = self._read_body()
        fake = self.server.fake
        fake._record(self.command, self.path, dict(self.headers), body, self.client_address[1])
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"Unknown path {self.path}"}})
            return
        if not isinstance(body, dict):
            self._send_json(400, {"error": {"message": "Body must be a JSON object"}})
            return
        if not self._authorised():
            return
        if fake.meter is not None:  # a tokens-per-minute limit: 429 with Retry-After
            wait = fake.meter.admit(count_words(body.get("messages") or []))
            if wait is not None:
                self._send_json(429, rate_limited_body(wait, fake.meter.limit),
                                {"Retry-After": f"{wait:g}"})
                return
        with fake._lock:  # how many chat requests are answered at once (provider limits)
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            self._answer(fake, body)
        finally:
            with fake._lock:
                fake.in_flight -= 1

    def _answer(self, fake: FakeLLM, body: dict[str, Any]) -> None:
        reply = fake._next_reply(body)
        if reply.wait_for_requests and not fake._await_requests(reply.wait_for_requests):
            reply = ScriptedReply(kind="error", status=400, body={"error": {
                "message": f"fake: fewer than {reply.wait_for_requests} requests arrived"}})
        fake._sleep(reply.initial_delay)
        try:
            if reply.kind == "error":
                self._send_error(reply)
            elif body.get("stream"):
                self._stream(reply, body)
            else:
                self._complete(reply, body)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True  # the client went away; nothing left to do

    # -- replies --------------------------------------------------------------------
    def _send_error(self, reply: ScriptedReply) -> None:
        body = reply.body
        if body is None:
            body = {"error": {"message": f"Fake error {reply.status}", "type": "server_error"}}
        if isinstance(body, str):
            body = body.encode()
        self._send_json(reply.status, body, reply.headers)

    def _usage(self, reply: ScriptedReply, body: dict[str, Any], pieces: int) -> dict[str, Any]:
        """Scripted counts, else the prompt's words and the answer's pieces; `fake:cached`
        (or a scripted third count) reports part of the prompt as cached."""
        messages = body.get("messages") or []
        counts = reply.usage or (count_words(messages), pieces,
                                 Directives.of(last_user_text(messages)).cached)
        prompt, completion, cached = (*counts, 0)[:3]
        if self.server.fake.meter is not None:
            self.server.fake.meter.add(completion)
        return usage_counts(prompt, completion, cached)

    def _tool_call_payload(self, reply: ScriptedReply) -> list[dict[str, Any]]:
        calls = []
        for index, (name, arguments) in enumerate(reply.tool_calls):
            raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
            calls.append(
                {
                    "index": index,
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": name, "arguments": raw},
                }
            )
        return calls

    def _stream(self, reply: ScriptedReply, body: dict[str, Any]) -> None:
        fake = self.server.fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model") or "fake-model",
        }
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if include_usage:
                out["usage"] = None
            return out

        self._sse(chunk({"role": "assistant", "content": ""}))
        pieces = split_text(reply.text, reply.chunks) if reply.text else []
        cap = max_tokens_of(body)
        finish_capped = None
        if cap is not None and len(pieces) > cap:  # max_tokens: one piece is one token
            pieces, finish_capped = pieces[:cap], "length"
        if reply.kind == "cut":
            pieces = pieces[: reply.cut_after]
        for i, piece in enumerate(pieces):
            if i:
                fake._sleep(reply.delay)
            self._sse(chunk({"content": piece}))
        if reply.kind == "cut":
            if reply.clean_cut:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            else:
                self._drop_connection()
            return
        calls = self._tool_call_payload(reply)
        for call in calls:
            # Stream each call as real providers do: header first, then argument pieces.
            head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
            self._sse(chunk({"tool_calls": [head]}))
            for piece in split_text(call["function"]["arguments"], 3):
                piece_delta = {"index": call["index"], "function": {"arguments": piece}}
                self._sse(chunk({"tool_calls": [piece_delta]}))
        finish = finish_capped or reply.finish_reason or ("tool_calls" if calls else "stop")
        self._sse(chunk({}, finish))
        if include_usage:
            self._sse({**base, "choices": [], "usage": self._usage(reply, body, len(pieces) or 1)})
        self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _drop_connection(self) -> None:
        """Close the socket without the final chunk: the client sees a cut stream."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _complete(self, reply: ScriptedReply, body: dict[str, Any]) -> None:
        if reply.kind == "cut":
            self._drop_connection()
            return
        calls = self._tool_call_payload(reply)
        for call in calls:
            del call["index"]
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if calls:
            message["tool_calls"] = calls
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        pieces = len(split_text(reply.text, reply.chunks)) if reply.text else 1
        self._send_json(
            200,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or "fake-model",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": self._usage(reply, body, pieces),
            },
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], fake: FakeLLM) -> None:
        self.fake = fake
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (and `stop()` closing sockets) are routine here.
        if self.fake.verbose:
            super().handle_error(request, client_address)


class FakeLLM:
    """A fake OpenAI-compatible provider running in a background thread.

    `start()` returns the base URL (`http://127.0.0.1:<port>/v1`); `stop()` shuts it
    down and drops open connections. Usable as a context manager. Any bearer key works
    except those in `bad_keys` (or, when `api_key` is set, any other key), which get an
    OpenAI-style 401. `behavior` picks the unscripted answer (`echo` or `assistant`);
    `chunk_delay` spaces unscripted chunks; `zero_latency` ignores every delay;
    `tokens_per_minute` makes it a rate-limited provider (see fake_meter).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        bad_keys: tuple[str, ...] = ("bad-key",),
        models: tuple[str, ...] = DEFAULT_MODELS,
        behavior: Literal["echo", "assistant"] = "echo",
        chunk_delay: float = 0.0,
        zero_latency: bool = False,
        verbose: bool = False,
        tokens_per_minute: int | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.api_key = api_key
        self.bad_keys = set(bad_keys)
        self.models = list(models)
        self.behavior = behavior
        self.chunk_delay = chunk_delay
        self.zero_latency = zero_latency
        self.verbose = verbose
        # A provider's tokens-per-minute limit (fake_meter): over it, 429 with Retry-After.
        self.meter = TokenMeter(tokens_per_minute) if tokens_per_minute else None
        self.in_flight = self.max_in_flight = 0
        self._queue: deque[ScriptedReply] = deque()
        self._requests: list[RecordedRequest] = []
        self._failures: dict[str, int] = {}  # fake:fail counts, per distinct prompt
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeLLM is not running; call start() first")
        return f"http://{self.host}:{self._server.server_address[1]}/v1"

    def start(self) -> str:
        """Start serving in a daemon thread; returns the base URL for clients."""
        if self._server is None:
            self._stopping.clear()
            self._server = _Server((self.host, self.port), self)
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.05,), name="fake-llm", daemon=True
            )
            self._thread.start()
        return self.base_url

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (the command-line mode)."""
        self._server = _Server((self.host, self.port), self)
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()
            self._server = None

    def stop(self) -> None:
        """Stop serving, wake delayed replies and close every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting ------------------------------------------------------------------
    def script(self, *replies: ScriptedReply) -> FakeLLM:
        """Queue replies; each chat request takes the next one, in order."""
        with self._lock:
            self._queue.extend(replies)
        return self

    def script_text(
        self,
        text: str,
        *,
        chunks: int | None = None,
        delay: float = 0.0,
        initial_delay: float = 0.0,
        finish_reason: str | None = None,
        usage: tuple[int, ...] | None = None,
        wait_for_requests: int = 0,
    ) -> FakeLLM:
        """Queue a text reply streamed in `chunks` pieces (None: one per word)."""
        return self.script(ScriptedReply(text=text, chunks=chunks, delay=delay, initial_delay=initial_delay,
                                         finish_reason=finish_reason, usage=usage,
                                         wait_for_requests=wait_for_requests))

    def script_json(self, value: Any, **options: Any) -> FakeLLM:
        """Queue a reply whose text is `value` as JSON: to script a structured answer, or a
        wrong one (a repair round follows); a str is sent verbatim (invalid JSON)."""
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        return self.script_text(text, **options)

    def script_tool_call(
        self, name: str, arguments: dict[str, Any] | str, *, text: str = ""
    ) -> FakeLLM:
        """Queue a reply that calls one tool (after optional streamed `text`)."""
        return self.script_tool_calls([(name, arguments)], text=text)

    def script_tool_calls(
        self, calls: list[tuple[str, dict[str, Any] | str]], *, text: str = ""
    ) -> FakeLLM:
        """Queue a reply that calls several tools at once."""
        return self.script(ScriptedReply(kind="tool_calls", text=text, tool_calls=list(calls)))

    def script_error(
        self,
        status: int,
        message: str | None = None,
        *,
        retry_after: float | None = None,
        error_type: str | None = None,
        code: str | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> FakeLLM:
        """Queue an HTTP error with an OpenAI-style body (or `body` verbatim)."""
        if body is None:
            default_type = (
                "rate_limit_error"
                if status == 429
                else "server_error"
                if status >= 500
                else "invalid_request_error"
            )
            body = {
                "error": {
                    "message": message or f"Fake error {status}",
                    "type": error_type or default_type,
                    "code": code,
                    "param": None,
                }
            }
        all_headers = dict(headers or {})
        if retry_after is not None:
            all_headers["Retry-After"] = f"{retry_after:g}"
        reply = ScriptedReply(kind="error", status=status, body=body, headers=all_headers)
        return self.script(reply)

    def script_cut(
        self,
        text: str = "This reply will be cut short",
        *,
        after_chunks: int = 1,
        clean: bool = False,
    ) -> FakeLLM:
        """Queue a stream that sends `after_chunks` text chunks, then drops the connection.

        With `clean`, the HTTP body ends properly instead, but still without a
        `finish_reason` or `[DONE]`.
        """
        return self.script(
            ScriptedReply(kind="cut", text=text, cut_after=after_chunks, clean_cut=clean)
        )

    def reset(self) -> None:
        """Forget queued replies and recorded requests."""
        with self._lock:
            self._queue.clear()
            self._requests.clear()
            self._failures.clear()

    @property
    def pending(self) -> int:
        """How many scripted replies are still queued."""
        with self._lock:
            return len(self._queue)

    # -- inspection -----------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat-completion requests received so far, those that were
        a JSON object: a client killed mid-request leaves one in `requests` that asked nothing."""
        return [
            r.body
            for r in self.requests
            if r.method == "POST" and r.path.rstrip("/").endswith("/chat/completions") and isinstance(r.body, dict)
        ]

    # -- used by the handler --------------------------------------------------------
    def _track(self, conn: socket.socket, opened: bool) -> None:
        with self._lock:
            (self._conns.add if opened else self._conns.discard)(conn)

    def _record(self, method: str, path: str, headers: dict[str, str], body: Any, client_port: int) -> None:
        lowered = {name.lower(): value for name, value in headers.items()}
        with self._lock:
            self._requests.append(RecordedRequest(method, path, lowered, body, client_port))

    def _next_reply(self, body: dict[str, Any]) -> ScriptedReply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        prompt = last_user_text(body.get("messages") or [])
        wanted = Directives.of(prompt)
        if wanted.fail:
            with self._lock:
                failed = self._failures.get(prompt, 0)
                if failed < wanted.fail:
                    self._failures[prompt] = failed + 1
                    return ScriptedReply(kind="error", status=wanted.fail_status, body={"error": {
                        "message": f"fake: failure {failed + 1} of {wanted.fail} (fake:fail)",
                        "type": "server_error" if wanted.fail_status >= 500 else "invalid_request_error"}})
        reply = unscripted_reply(body, self.behavior)
        reply.delay = self.chunk_delay
        return reply

    def _await_requests(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until `count` chat requests were received; False past `timeout`."""
        deadline = time.monotonic() + timeout
        while len(self.chat_requests) < count:
            if time.monotonic() > deadline or self._stopping.wait(0.01):
                return False
        return True

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and not self.zero_latency:
            self._stopping.wait(seconds)


def main(argv: list[str] | None = None) -> None:
    """Command line: serve a friendly fake provider until Ctrl-C."""
    parser = argparse.ArgumentParser(
        description="Fake OpenAI-compatible LLM server: streams real chunks on loopback, needs no key.",
        epilog=DIRECTIVES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--api-key", default=None, help="accept only this key (default: any)")
    parser.add_argument("--mode", choices=("assistant", "echo"), default="assistant")
    parser.add_argument("--delay", type=float, default=0.03, help="seconds between chunks")
    parser.add_argument("--zero-latency", action="store_true", help="never sleep (benchmarks)")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    parser.add_argument("--tokens-per-minute", type=int, default=None,
                        help="answer 429 with Retry-After above this many tokens a minute")
    args = parser.parse_args(argv)

    fake = FakeLLM(host=args.host, port=args.port, api_key=args.api_key, behavior=args.mode,
                   chunk_delay=args.delay, zero_latency=args.zero_latency, verbose=args.verbose,
                   tokens_per_minute=args.tokens_per_minute)
    url = f"http://{args.host}:{args.port}/v1"
    print(f"Fake LLM serving at {url}  (mode: {args.mode}; Ctrl-C to stop)")
    key = (f"--api-key-stdin  (and type {args.api_key})" if args.api_key
           else "--no-api-key  (any key is taken, none is needed)")
    print(f"Register it as a provider:\n  orchestra provider add fake --kind openai_compatible "
          f"--model-id fake-model --base-url {url} {key}", flush=True)
    try:
        fake.serve_forever()
    except KeyboardInterrupt:
        print("\nstopped")


if __name__ == "__main__":
    main()
