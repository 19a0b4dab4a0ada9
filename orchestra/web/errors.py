"""The one mapping from any exception to SPEC §1's JSON error body."""

from __future__ import annotations

import logging

from sanic import Request, Sanic
from sanic import exceptions as sanic_exc
from sanic.response import HTTPResponse, json

from orchestra.errors import (
    BadRequestError,
    MethodNotAllowedError,
    NotFoundError,
    OrchestraError,
    PayloadTooLargeError,
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
        return BadRequestError(str(exc) or BadRequestError.default_message)
    if isinstance(exc, sanic_exc.SanicException) and 400 <= exc.status_code < 500:
        error = OrchestraError(str(exc) or "The request was refused.")
        error.status = exc.status_code
        error.error = type(exc).__name__ + ("" if type(exc).__name__.endswith("Error") else "Error")
        return error
    logger.exception("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return OrchestraError()


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
