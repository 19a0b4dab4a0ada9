"""The one place that relies on Sanic internals: writing SSE chunks straight to the socket.

On Sanic's own HTTP/1.1 server a chunked response is written by
`Http.http1_response_chunked`, and the protocol records the time of its last write in
`_time` (the response timeout reads it). A live event written by the feed to many
readers goes straight to each transport, framed here as one HTTP/1.1 chunk built once.
If Sanic changes either detail (checked against the versions below and at run time),
`direct_writer` answers None and every write goes through Sanic's public
`response.send`, which is slower with many readers but correct.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import sanic
from sanic import Request

from orchestra.engine.store.events import Event

TESTED_MAJOR_VERSIONS = ("24", "25")
SLOW_READER_BYTES = 256 * 1024  # unsent bytes past which a reader leaves the live path
DIRECT_CHUNK_MAX = 64 * 1024  # larger chunks are not copied into every reader's buffer


CHUNK_CACHE_EVENTS = 256  # recent small chunks kept, so many readers share one copy
CHUNK_CACHE_FRAME_MAX = 64 * 1024
_chunks: OrderedDict[tuple[str, int], bytes] = OrderedDict()


def chunk(frame: bytes) -> bytes:
    """`frame` as one HTTP/1.1 chunk: hex size, CRLF, data, CRLF."""
    return b"%x\r\n%b\r\n" % (len(frame), frame)


def event_chunk(trace_id: str, event: Event) -> bytes:
    """The event's frame as one chunk, built once for all of a process's readers."""
    frame = event.frame()
    if len(frame) > CHUNK_CACHE_FRAME_MAX:
        return chunk(frame)
    key = (trace_id, event.seq)
    data = _chunks.get(key)
    if data is None:
        data = _chunks[key] = chunk(frame)
        if len(_chunks) > CHUNK_CACHE_EVENTS:
            _chunks.popitem(last=False)
    return data


def direct_writer(request: Request, response) -> Callable[[bytes], bool] | None:
    """A non-blocking writer of whole chunks to this response's socket (False: the reader
    is too far behind or gone), or None where Sanic's internals are not as expected."""
    if sanic.__version__.split(".")[0] not in TESTED_MAJOR_VERSIONS:
        return None
    func = getattr(getattr(response, "stream", None), "response_func", None)
    if getattr(func, "__name__", "") != "http1_response_chunked":
        return None
    transport = request.transport
    protocol = transport.get_protocol()
    if not hasattr(transport, "get_write_buffer_size") or not hasattr(protocol, "_time"):
        return None
    loop_time = request.app.loop.time

    def write(data: bytes) -> bool:
        if (len(data) > DIRECT_CHUNK_MAX or transport.is_closing()
                or transport.get_write_buffer_size() > SLOW_READER_BYTES):
            return False  # a large frame goes through the reader's task, in drained slices
        transport.write(data)
        protocol._time = loop_time()  # what Sanic's own send records (response timeout)
        return True

    return write
