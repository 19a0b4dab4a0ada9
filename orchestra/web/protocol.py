"""The HTTP/1.1 protocol `orchestra serve` runs: Sanic's, with a firm deadline and firm
limits for the request head.

Sanic times a request from the last byte received, so a client that trickles its head
one byte at a time is never timed out (slowloris). Here the whole head must arrive within
`ORCHESTRA_HEADER_TIMEOUT` seconds of its first byte, whatever the pace; a late head is
answered 408 and the connection closed. A head over its limits (all of it, one field, or
the number of fields) is answered 431 `RequestHeaderFieldsTooLargeError`, not Sanic's 413.
A body must then keep up an average of `ORCHESTRA_BODY_MIN_RATE` bytes a second once it
has had as long as a head may take (counting only the time spent waiting for the client,
not the handler's own), or it too is answered 408 and the connection closed: a slow body
would otherwise hold its connection for 60 s per byte.
A HEAD request whose handler streams its response ends after the head, without a crash.
"""

from __future__ import annotations

import asyncio
import logging
import resource

from sanic.exceptions import PayloadTooLarge
from sanic.http import Http, Stage
from sanic.server.protocols.http_protocol import HttpProtocol

from orchestra.errors import RequestHeaderFieldsTooLargeError, RequestTimeoutError

logger = logging.getLogger("orchestra.web")

HEAD_MAX_BYTES = 16 * 1024  # the whole request head (Sanic's ceiling)
FIELD_MAX_BYTES = 8 * 1024  # the request line or one header field
MAX_FIELDS = 100  # header fields in one request


def head_problem(head: bytes) -> str | None:
    """Why a complete request head (without its final blank line) is over the limits."""
    if head.count(b"\r\n") > MAX_FIELDS:
        return f"The request has more than {MAX_FIELDS} header fields."
    # A head no longer than a field's limit has no field over it (the usual case: no split).
    if len(head) > FIELD_MAX_BYTES and max(len(line) for line in head.split(b"\r\n")) > FIELD_MAX_BYTES:
        return f"A request header field (or the request line) is longer than {FIELD_MAX_BYTES} bytes."
    return None


class DeadlineHttp(Http):
    """Sanic's HTTP/1.1 request cycle with a head deadline, head limits and a minimum
    body rate."""

    __slots__ = ("body_received", "body_waited")

    def init_for_request(self) -> None:
        super().init_for_request()
        self.body_received = 0
        self.body_waited = 0.0

    async def read(self) -> bytes | None:
        """A piece of the body, within the time the minimum rate allows for it."""
        min_rate = getattr(self.protocol, "body_min_rate", 0)
        grace = getattr(self.protocol, "header_timeout", None)
        if not min_rate or grace is None:
            return await super().read()
        allowed = grace + self.body_received / min_rate - self.body_waited
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(max(allowed, 0.001)):
                data = await super().read()
        except TimeoutError:
            self.keep_alive = False
            self.request_body = None  # nothing more is read from this connection
            if self.stage is not Stage.HANDLER:  # Sanic draining a body after the response
                return None
            raise RequestTimeoutError(
                f"The request body arrived slower than {min_rate} bytes a second."
            ) from None
        finally:
            self.body_waited += loop.time() - started
        self.body_received += len(data or b"")
        return data

    async def http1_request_header(self) -> None:
        """Receive and parse the head within the deadline (from its first byte, which
        has already arrived when this is called) and within the head limits."""
        timeout = getattr(self.protocol, "header_timeout", None)
        try:
            if self.recv_buffer.find(b"\r\n\r\n", 0, HEAD_MAX_BYTES + 4) >= 0:
                # The whole head has arrived (the usual case): reading it cannot wait, so
                # no timer is armed (an asyncio.timeout costs a few % of a small request).
                await super().http1_request_header()
            else:
                async with asyncio.timeout(timeout):
                    await super().http1_request_header()
        except TimeoutError:
            self.keep_alive = False
            raise RequestTimeoutError(
                f"The request head did not arrive within {timeout:g} seconds."
            ) from None
        except PayloadTooLarge:  # Sanic's only reason while reading the head: its size
            self.keep_alive = False
            raise RequestHeaderFieldsTooLargeError(
                f"The request head is larger than {self.HEADER_MAX_SIZE} bytes."
            ) from None
        problem = head_problem(self.request.head)
        if problem:
            self.keep_alive = False
            self.request_body = None  # the connection closes: never read what follows
            raise RequestHeaderFieldsTooLargeError(problem)

    async def head_response_ignored(self, data: bytes, end_stream: bool) -> None:
        """HEAD: body data dropped. Sanic's version is not awaitable, so a streaming
        handler's second `send` raised TypeError (and dropped the connection)."""
        super().head_response_ignored(data, end_stream)


class OrchestraProtocol(HttpProtocol):
    """The protocol class to pass to Sanic (`app.prepare(protocol=...)`)."""

    HTTP_CLASS = DeadlineHttp
    __slots__ = ("header_timeout", "body_min_rate")

    def _setup(self) -> None:
        super()._setup()
        self.header_timeout = self.app.ctx.settings.header_timeout
        self.body_min_rate = self.app.ctx.settings.body_min_rate


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit (each connection is one),
    as Go's runtime and many servers do; returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # some platforms refuse; the old limit stays
            logger.warning("could not raise the open-file limit above %s", soft)
    return soft, hard
