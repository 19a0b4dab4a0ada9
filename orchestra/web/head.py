"""`HEAD` on every `GET` route: the same status and headers as `GET`, never a body; and
`OPTIONS` on every path: 204 with the path's methods in `Allow`.

A HEAD route is added next to every GET route once all routes are known (sanic-ext's own
automatic HEAD and OPTIONS are switched off: its HEAD ran streaming handlers to the end,
and the SSE one crashed). The HEAD handler runs the GET handler, so authentication, 404s
and 204s are exactly those of GET. A handler that streams (the SSE stream, a download) calls
`request.respond()`; on HEAD that sends the head — `Transfer-Encoding: chunked` or the
handler's own `Content-Length`, as GET would — and stops the handler right there, before
it subscribes to anything or reads a byte of the file.
"""

from __future__ import annotations

from functools import partial
from inspect import isawaitable

from sanic import HTTPResponse, Request, Sanic
from sanic.response import empty


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


def add_method_routes(app: Sanic) -> None:
    """Give every GET route a HEAD route and every path an OPTIONS route (204 with
    `Allow`). Called by `OrchestraSanic._startup` when every route is known and before
    Sanic finalizes the router, so the router is compiled once per start; adding them
    from a start-up listener, as sanic-ext does, re-compiled it twice more (~20 ms a
    start, most of an in-process test's set-up)."""
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
    for group in list(app.router.groups.values()):
        if "OPTIONS" in group.methods:
            continue
        hosts = {r.get("host") for r in group.requirements} if group.requirements else {None}
        base = next((r for r in group if not r.name.endswith("_head")), group[0])
        app.add_route(
            handler=partial(_options_handler, allow=",".join([*sorted(group.methods), "OPTIONS"])),
            uri=group.uri,
            methods=["OPTIONS"],
            strict_slashes=group.strict,
            name=f"{base.name}_options",
            host=list(hosts) if hosts != {None} else None,
            unquote=group.unquote,
        )


async def _options_handler(request: Request, *args, allow: str, **kwargs) -> HTTPResponse:
    return empty(headers={"allow": allow})
