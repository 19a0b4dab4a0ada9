"""The SSE response writer: `id:`/`event:`/`data:` frames, `: ping` comments, clean end.

The handler authorises and decides 204/404 before calling `send_stream`; from then on
the response is `text/event-stream` and each frame is sent as soon as it is read. The
client hanging up cancels this handler task (Sanic does so on connection loss), never the run.

On Sanic's own HTTP/1.1 server, once the reader has caught up, live events are written
straight to the socket by the publisher (`direct_sink`): the same chunk bytes for every
reader, no task wake-up per reader. A reader whose socket has more than `SLOW_READER_BYTES`
unsent is dropped from the live feed and catches up from the store at its own pace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from sanic import Request

from orchestra.engine.events import PING, Event

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PING_FRAME = b": ping\n\n"
HELLO_FRAME = b": connected\n\n"  # a comment: flushes the headers at once, ignored by readers
SLOW_READER_BYTES = 256 * 1024


def direct_sink(request: Request, response) -> Callable[[Event], bool] | None:
    """A writer of live events straight to the socket, when the response is Sanic's own
    HTTP/1.1 chunked stream (None under ASGI or any other framing)."""
    func = getattr(getattr(response, "stream", None), "response_func", None)
    if getattr(func, "__name__", "") != "http1_response_chunked":
        return None
    transport = request.transport
    protocol = transport.get_protocol()
    if not hasattr(transport, "get_write_buffer_size") or not hasattr(protocol, "_time"):
        return None
    loop_time = request.app.loop.time

    def sink(event: Event) -> bool:
        if transport.is_closing() or transport.get_write_buffer_size() > SLOW_READER_BYTES:
            return False
        transport.write(event.chunk())
        protocol._time = loop_time()  # what Sanic's own send records (response timeout)
        return True

    return sink


async def send_stream(request: Request, events: AsyncIterator[Event | None]) -> None:
    """Write `events` (PING = keep-alive) as an event stream, ending after the last one."""
    response = await request.respond(
        status=200, headers=dict(SSE_HEADERS), content_type="text/event-stream; charset=utf-8"
    )
    await response.send(HELLO_FRAME)
    if hasattr(events, "sink"):
        events.sink = direct_sink(request, response)
    try:
        async for item in events:
            await response.send(PING_FRAME if item is PING else item.frame())
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    await response.eof()


def parse_last_event_id(request: Request) -> int:
    """`Last-Event-ID` header, else `?last_event_id=`; 0 when absent; 422 when not a count."""
    from orchestra.errors import ValidationError

    raw = request.headers.get("last-event-id")
    field = "Last-Event-ID"
    if raw is None or not raw.strip():
        raw, field = request.args.get("last_event_id"), "last_event_id"
    if raw is None or not str(raw).strip():
        return 0
    raw = str(raw).strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:  # "５" is a digit to isdigit()
        raise ValidationError.field(field, "must be a non-negative integer (an event id)")
    return int(raw)
