"""The SSE response writer: `id:`/`event:`/`data:` frames, `: ping` comments, clean end.

The handler authorises and decides 204/404 before calling `send_stream`; from then on
the response is `text/event-stream` and each frame is sent as soon as it is read. The
client hanging up cancels this handler task (Sanic does so on connection loss), never the run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sanic import Request

from orchestra.engine.events import PING, Event

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PING_FRAME = b": ping\n\n"
HELLO_FRAME = b": connected\n\n"  # a comment: flushes the headers at once, ignored by readers


async def send_stream(request: Request, events: AsyncIterator[Event | None]) -> None:
    """Write `events` (PING = keep-alive) as an event stream, ending after the last one."""
    response = await request.respond(
        status=200, headers=dict(SSE_HEADERS), content_type="text/event-stream; charset=utf-8"
    )
    await response.send(HELLO_FRAME)
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
    if not raw.isdigit() or len(raw) > 18:
        raise ValidationError.field(field, "must be a non-negative integer (an event id)")
    return int(raw)
