"""The one mapping from any exception to SPEC §1's JSON error body."""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os

from sanic import Request, Sanic
from sanic import exceptions as sanic_exc
from sanic.response import HTTPResponse, json

from orchestra.db.outage import RETRY_AFTER_SECONDS, StoreOutage
from orchestra.errors import (
    BadRequestError,
    MethodNotAllowedError,
    NotFoundError,
    OrchestraError,
    OverloadedError,
    PayloadTooLargeError,
    StoreUnavailableError,
)

logger = logging.getLogger("orchestra.web")


def to_orchestra_error(request: Request, exc: BaseException) -> OrchestraError:
    """Translate Sanic's own exceptions (routing, body size, parsing) into ours."""
    if isinstance(exc, OrchestraError):
        return exc
    if isinstance(exc, sanic_exc.MethodNotAllowed):
        allowed = sorted(getattr(exc, "allowed_methods", None) or _allowed_methods(request))
        headers = {"Allow": ", ".join(allowed)} if allowed else {}
        return MethodNotAllowedError(
            f"{request.method} is not allowed on {request.path}.", headers=headers
        )
    if isinstance(exc, sanic_exc.NotFound):
        return NotFoundError(f"Nothing is at {request.method} {request.path}.")
    if isinstance(exc, sanic_exc.PayloadTooLarge):
        return PayloadTooLargeError()
    if isinstance(exc, sanic_exc.BadRequest):
        if str(exc) in ("", "Bad Request"):  # Sanic's word for a request head it cannot parse
            return BadRequestError("The request is not well-formed HTTP/1.1.")
        return BadRequestError(str(exc))
    if isinstance(exc, sanic_exc.ServiceUnavailable):  # Sanic's response timeout
        return _not_served_in_time(request, exc)
    if isinstance(exc, sanic_exc.SanicException) and 400 <= exc.status_code < 500:
        error = OrchestraError(str(exc) or "The request was refused.")
        error.status = exc.status_code
        error.error = type(exc).__name__ + ("" if type(exc).__name__.endswith("Error") else "Error")
        return error
    if _out_of_descriptors(exc):
        logger.warning("out of file descriptors on %s %s: answered 503", request.method, request.path)
        return OverloadedError(
            "The server has no free connections or files right now; try again shortly.",
            headers={"Retry-After": "1"},
        )
    outage = _store_outage(request)
    if outage is not None and outage.failed(exc, f"{request.method} {request.path}"):
        return StoreUnavailableError(headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, (TimeoutError, asyncio.CancelledError)):  # a deadline passed
        return _not_served_in_time(request, exc)
    logger.exception("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return OrchestraError()


def _not_served_in_time(request: Request, exc: BaseException) -> OverloadedError:
    """A request that could not be served in time: Sanic's response timeout (the handler
    was silent past `ORCHESTRA_RESPONSE_TIMEOUT`, e.g. queued behind a busy event loop or
    a locked store), a deadline of our own, or its task cancelled while the client is still
    there. The client may try again; never a 500."""
    timeout = request.app.config.RESPONSE_TIMEOUT
    if not getattr(exc, "quiet", False):  # Sanic's RequestCancelled: the client left, no news
        logger.warning("%s %s was not served in time (%s): answered 503", request.method,
                       request.path, type(exc).__name__)
    message = "The request could not be served in time; try again shortly."
    if isinstance(exc, sanic_exc.ServiceUnavailable):
        message = (f"The request could not be served within {timeout:g} seconds "
                   "(ORCHESTRA_RESPONSE_TIMEOUT); try again shortly.")
    return OverloadedError(message, headers={"Retry-After": str(max(1, math.ceil(min(timeout, 5))))})


def _store_outage(request: Request) -> StoreOutage | None:
    """This process's outage tracker (one per Core: the engine and requests share it)."""
    core = getattr(request.app.ctx, "core", None)
    if core is None:
        return None
    return core.outage


_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def _out_of_descriptors(exc: BaseException) -> bool:
    """Whether `exc` comes from the process (or system) running out of file descriptors:
    an OSError saying so anywhere in its chain, or any failure while no descriptor can be
    had (a driver's own error, e.g. SQLite's "unable to open database file", hides it)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in _NO_DESCRIPTORS:
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        os.close(os.dup(2))
    except OSError as probe:
        return probe.errno in _NO_DESCRIPTORS
    return False


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    """The methods routed at this path (Sanic leaves them out for dynamic routes)."""
    allowed = []
    for method in _METHODS:
        try:
            request.app.router.get(request.path, method, request.headers.get("host"))
        except sanic_exc.SanicException:
            continue
        allowed.append(method)
    return allowed


def error_response(request: Request, exc: BaseException) -> HTTPResponse:
    error = to_orchestra_error(request, exc)
    return json(error.to_body(), status=error.status, headers=error.headers)


def install(app: Sanic) -> None:
    """Route every exception of `app` through `error_response`."""
    app.error_handler.add(Exception, error_response)
    # Not an Exception: Sanic hands a cancelled request task's CancelledError here too.
    app.error_handler.add(asyncio.CancelledError, error_response)
