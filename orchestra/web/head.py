"""`HEAD` on every `GET` route: the same status and headers as `GET`, never a body.

A HEAD route is added next to every GET route once all routes are known (sanic-ext's own
automatic HEAD is switched off: it ran streaming handlers to the end, and the SSE one
crashed). The HEAD handler runs the GET handler, so authentication, 404s and 204s are
exactly those of GET. A handler that streams (the SSE stream, a download) calls
`request.respond()`; on HEAD that sends the head — `Transfer-Encoding: chunked` or the
handler's own `Content-Length`, as GET would — and stops the handler right there, before
it subscribes to anything or reads a byte of the file.
"""

from __future__ import annotations

from functools import partial
from inspect import isawaitable

from sanic import Request, Sanic


class _HeadSent(Exception):
    """Control flow: the head of a streamed response is sent; the handler stops."""


class OrchestraRequest(Request):
    """Sanic's request; `respond()` on a HEAD request sends the head and stops the handler."""

    async def respond(self, response=None, *, status=200, headers=None, content_type=None):
        answer = await super().respond(
            response, status=status, headers=headers, content_type=content_type
        )
        if self.method == "HEAD" and response is None and getattr(self.ctx, "head_route", False):
            await answer.send(b"", end_stream=False)  # the head, framed as GET frames it
            raise _HeadSent()
        return answer


async def _head_handler(request: Request, *args, get_handler, **kwargs):
    request.ctx.head_route = True
    try:
        answer = get_handler(request, *args, **kwargs)
        if isawaitable(answer):
            answer = await answer
    except _HeadSent:
        return None
    return answer


def add_head_routes(app: Sanic) -> None:
    """Give every GET route without a HEAD route one (call when all routes are added)."""
    app.router.reset()
    for group in list(app.router.groups.values()):
        if "GET" not in group.methods or "HEAD" in group.methods:
            continue
        for route in group:
            if "GET" not in route.methods:
                continue
            handler = partial(_head_handler, get_handler=route.handler)
            handler.__route_handler__ = route.handler  # type: ignore[attr-defined]
            app.add_route(
                handler=handler,
                uri=group.uri,
                methods=["HEAD"],
                strict_slashes=group.strict,
                name=f"{route.name}_head",
                host=route.requirements.get("host"),
                unquote=group.unquote,
            )
    app.finalize()


def _hold_signals(app: Sanic) -> None:
    """Routes added after start-up re-finalize Sanic's signal router one by one (`amend`,
    ~13 ms each on a small machine): with ours and sanic-ext's OPTIONS routes that was
    most of a second per app start (and of every in-process test). Reset it once here;
    `_finalize_signals` finalizes it once when all of them are added."""
    if app.signal_router.finalized:
        app.signal_router.reset()


def _finalize_signals(app: Sanic) -> None:
    if not app.signal_router.finalized:
        app.signalize(app.config.TOUCHUP)


def install(app: Sanic) -> None:
    """Add the HEAD routes when the server starts, when every route is known. Listeners
    run in the order they are added: install before `app.extend`, so that sanic-ext's
    automatic OPTIONS handlers (added at start too) list HEAD in their `Allow`; call
    `install_last` after it."""
    app.before_server_start(_hold_signals)
    app.before_server_start(add_head_routes)


def install_last(app: Sanic) -> None:
    """After every start-up listener, sanic-ext's too (they run at priority -1000, after
    the default 0): the signal router, finalized once."""
    app.before_server_start(_finalize_signals, priority=LAST)


LAST = -1_000_000  # start-up listeners run by priority, highest first
