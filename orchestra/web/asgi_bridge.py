"""Serve one Sanic request with an ASGI application (the MCP SDK's transport is one).

The request's body has been read by Sanic already: the application receives it in one
`http.request` message, then `http.disconnect` once the client hangs up. Sanic cancels a
request's task when its client hangs up; an ASGI application is told instead and ends
itself (the MCP SDK keeps a session only once its opening exchange ran to the end), so
the application runs in a task of its own. What it sends is streamed through Sanic's own
response (`request.respond`), so the response middleware (request ids, metrics, the
store connection handed back) runs as for any other answer; what it sends after the
client left is dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sanic import Request
from sanic.compat import Header

_running: set[asyncio.Task] = set()  # applications still ending after their client left

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
AsgiApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]


def scope_of(request: Request, extra: dict[str, Any] | None = None) -> Scope:
    """The ASGI HTTP scope of a Sanic request (plus `extra` keys for the application)."""
    client = (request.ip, int(request.port or 0)) if request.ip else None
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.version or "1.1",
        # HEAD is answered as GET (web/head.py leaves the body out), as on every route
        "method": "GET" if request.method == "HEAD" else request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode("latin-1", "replace"),
        "query_string": (request.query_string or "").encode("latin-1", "replace"),
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1", "replace"))
                    for k, v in request.headers.items()],
        "client": client,
        "server": (request.server_name, int(request.server_port or 0)),
        "state": {},
        **(extra or {}),
    }


class _Answer:
    """What the application sends, written through Sanic's streaming response; dropped
    once the client has left (`gone`)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.gone = asyncio.Event()
        self.response: Any = None
        self.status = 200
        self.headers: Header = Header()
        self.ended = False

    async def send(self, message: Message) -> None:
        if self.gone.is_set() or self.ended:
            return
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = Header([(k.decode("latin-1"), v.decode("latin-1"))
                                   for k, v in message.get("headers", ())])
        elif message["type"] == "http.response.body":
            await self._start()
            if message.get("body"):
                await self.response.send(message["body"])
            if not message.get("more_body", False):
                await self.end()

    async def _start(self) -> None:
        if self.response is None:
            content_type = self.headers.pop("content-type", None)
            self.headers.pop("content-length", None)  # Sanic frames the body itself
            self.response = await self.request.respond(status=self.status, headers=self.headers,
                                                       content_type=content_type)

    async def end(self) -> None:
        if not self.ended:
            self.ended = True
            await self._start()  # an answer of a status alone
            await self.response.eof()


async def serve(request: Request, app: AsgiApp, extra: dict[str, Any] | None = None) -> None:
    """Run `app` for `request`; its answer is written before this returns."""
    answer = _Answer(request)
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body or b"", "more_body": False}
        await answer.gone.wait()
        return {"type": "http.disconnect"}

    task = asyncio.get_running_loop().create_task(app(scope_of(request, extra), receive, answer.send))
    _running.add(task)
    task.add_done_callback(_running.discard)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        answer.gone.set()  # the client left: the application is told, and ends on its own
        raise
    await answer.end()
