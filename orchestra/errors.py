"""The error tree: every failure a service can report, with its HTTP status and name.

Services raise these; the web layer (`orchestra.web.errors`) and the CLI
(`orchestra.cli.console`) each map them in exactly one place.
"""

from __future__ import annotations

from typing import Any


class OrchestraError(Exception):
    """Base of every error a client may see. `error` is the name in the JSON body."""

    status: int = 500
    error: str = "InternalError"
    default_message: str = "The server could not complete the request."

    def __init__(
        self,
        message: str | None = None,
        *,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.detail = detail
        self.headers = dict(headers or {})
        super().__init__(self.message)

    def to_body(self) -> dict[str, Any]:
        """The one error body of SPEC §1."""
        body: dict[str, Any] = {"message": self.message, "error": self.error}
        if self.detail is not None:
            body["detail"] = self.detail
        return body


class BadRequestError(OrchestraError):
    status, error = 400, "BadRequestError"
    default_message = "The request body must be a JSON object."


class AuthenticationRequiredError(OrchestraError):
    status, error = 401, "AuthenticationRequiredError"
    default_message = "This route needs an access token: send 'Authorization: Bearer <token>'."


class TokenInvalidError(OrchestraError):
    status, error = 401, "TokenInvalidError"
    default_message = "The token is invalid."


class TokenExpiredError(OrchestraError):
    status, error = 401, "TokenExpiredError"
    default_message = "The token has expired."


class InvalidCredentialsError(OrchestraError):
    status, error = 401, "InvalidCredentialsError"
    default_message = "The password is wrong."


class PermissionDeniedError(OrchestraError):
    status, error = 403, "PermissionDeniedError"
    default_message = "Your role does not allow this operation."


class UserNotExistError(OrchestraError):
    status, error = 404, "UserNotExistError"
    default_message = "No such user."


class NotFoundError(OrchestraError):
    status, error = 404, "NotFoundError"
    default_message = "Not found."


class MethodNotAllowedError(OrchestraError):
    status, error = 405, "MethodNotAllowedError"
    default_message = "This method is not allowed on this path."


class UserAlreadyExistsError(OrchestraError):
    status, error = 409, "UserAlreadyExistsError"
    default_message = "That user name is taken."


class LastSuperAdministratorError(OrchestraError):
    status, error = 409, "LastSuperAdministratorError"
    default_message = "This would leave the service without a super administrator."


class ConflictError(OrchestraError):
    status, error = 409, "ConflictError"
    default_message = "The request conflicts with the current state."


class PayloadTooLargeError(OrchestraError):
    status, error = 413, "PayloadTooLargeError"
    default_message = "The request body is too large."


class RequestTimeoutError(OrchestraError):
    status, error = 408, "RequestTimeoutError"
    default_message = "The request did not arrive in time."


class RequestHeaderFieldsTooLargeError(OrchestraError):
    status, error = 431, "RequestHeaderFieldsTooLargeError"
    default_message = "The request head is too large."


class ValidationError(OrchestraError):
    status, error = 422, "ValidationError"
    default_message = "The request body does not match the expected shape."

    @classmethod
    def field(cls, field: str, problem: str) -> ValidationError:
        """A validation error about one field, with SPEC's `{field, problem}` detail."""
        return cls(f"{field}: {problem}", detail=[{"field": field, "problem": problem}])


class RateLimitedError(OrchestraError):
    status, error = 429, "RateLimitedError"
    default_message = "Too many requests; try again later."


class ProviderError(OrchestraError):
    """The model provider answered with an error or could not be reached."""

    status, error = 502, "ProviderError"
    default_message = "The model provider could not be reached."


class OverloadedError(OrchestraError):
    status, error = 503, "OverloadedError"
    default_message = "The server is busy; try again shortly."


class StoreUnavailableError(OrchestraError):
    """The store cannot be reached right now (restarting, failing over, pool exhausted):
    the request may be sent again after `Retry-After` seconds (SPEC §6)."""

    status, error = 503, "StoreUnavailableError"
    default_message = "The store is unavailable for a moment; try again shortly."
