"""The SSE response writer: `id:`/`event:`/`data:` frames, `: ping` comments, clean end.

The handler authorises and decides 204/404 before calling `send_stream`; from then on
the response is `text/event-stream` and each frame is sent as soon as it is read. The
client hanging up cancels this handler task (Sanic does so on connection loss), never
the run. A frame is sent in slices of SEND_SLICE bytes, each waiting for the socket to
drain, so a reader that does not read holds at most a slice and a socket buffer; a
reader that takes nothing for `sse_send_timeout` seconds is disconnected (it resumes
with `Last-Event-ID`). Once the reader has caught up, live events are written by the
feed straight to the socket (`sanic_stream.direct_writer`), one shared chunk per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sanic import Request

from orchestra.engine.feed import PING
from orchestra.engine.store.events import Event
from orchestra.observability import metrics
from orchestra.web.sanic_stream import direct_writer, event_chunk

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PING_FRAME = b": ping\n\n"
HELLO_FRAME = b": connected\n\n"  # a comment: flushes the headers at once, ignored by readers
# Sent when the stream's deadline (ORCHESTRA_SSE_MAX_SECONDS) ends it: no event, only a
# reconnection delay, which tells a client the end was planned (resume at once).
DEADLINE_FRAME = b"retry: 100\n\n"
SEND_SLICE = 64 * 1024


class SlowReader(Exception):
    """The client took no bytes for the send timeout."""


async def send_stream(
    request: Request, trace_id: str, events: AsyncIterator[Event | None], *, send_timeout: float,
    max_seconds: float = 0.0,
) -> None:
    """Write `events` (PING = keep-alive) as an event stream, ending after the last one, or
    after `max_seconds` (if not 0) with DEADLINE_FRAME."""
    response = await request.respond(
        status=200, headers=dict(SSE_HEADERS), content_type="text/event-stream; charset=utf-8"
    )

    async def send(data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), SEND_SLICE):
            piece = data if len(data) <= SEND_SLICE else view[start:start + SEND_SLICE].tobytes()
            try:
                async with asyncio.timeout(send_timeout):
                    await response.send(piece)
            except TimeoutError:
                raise SlowReader() from None

    metrics.sse_subscribers(1)
    try:
        await send(HELLO_FRAME)
        write = direct_writer(request, response)
        if write is not None and hasattr(events, "sink"):
            events.sink = lambda event: write(event_chunk(trace_id, event))
        try:
            async with asyncio.timeout(max_seconds or None):
                async for item in events:
                    await send(PING_FRAME if item is PING else item.frame())
        except TimeoutError:
            if hasattr(events, "sink"):
                events.sink = None  # the feed writes no more live events to this socket
            await send(DEADLINE_FRAME)
        await response.eof()
    except SlowReader:
        abort = getattr(request.transport, "abort", None)
        if abort is not None:
            abort()  # drop what is buffered: the reader resumes with Last-Event-ID
    finally:
        metrics.sse_subscribers(-1)
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def parse_last_event_id(request: Request) -> int:
    """`Last-Event-ID` header, else `?last_event_id=`; 0 when absent; 422 when not a count.

    An empty header is absent (a browser's EventSource sends none until it has an id); an
    empty `?last_event_id=` is a 422, like any other value that is not a count."""
    from orchestra.errors import ValidationError
    from orchestra.web.paging import raw_arg

    raw = request.headers.get("last-event-id")
    field = "Last-Event-ID"
    if raw is None or not raw.strip():
        raw, field = raw_arg(request, "last_event_id"), "last_event_id"
    if raw is None:
        return 0
    raw = str(raw).strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:  # "５" is a digit to isdigit()
        raise ValidationError.field(field, "must be a non-negative integer (an event id)")
    return int(raw)
