"""Request body parsing: 400 for what is not a JSON object, 422 for the wrong shape."""

from __future__ import annotations

from typing import ClassVar, TypeVar

import pydantic
from sanic import Request

from orchestra import json_body
from orchestra.errors import BadRequestError, PayloadTooLargeError, ValidationError

M = TypeVar("M", bound=pydantic.BaseModel)
STR_MAX = 1_000_000  # characters in any one string of a body (the body itself is at most 1 MiB)


class Body(pydantic.BaseModel):
    """Base of request bodies: strict types (no "1" for 1), unknown fields ignored.
    A NUL character in any string is a 422, unless the body's service handles it itself
    (`accepts_nul = True`), as login does: there a name that cannot exist is simply unknown."""

    accepts_nul: ClassVar[bool] = False

    model_config = pydantic.ConfigDict(strict=True, str_max_length=STR_MAX)


class ClosedBody(Body):
    """A body that refuses fields it does not name (422)."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid")


def read_json_object(request: Request) -> dict:
    """The body as a dict; BadRequestError when it is not a JSON object (strict RFC 8259
    UTF-8 JSON: see `orchestra.json_body`)."""
    # A missing Content-Type is read as JSON; a different one is refused.
    content_type = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if content_type and content_type != "application/json" and not content_type.endswith("+json"):
        raise BadRequestError(
            f"Send the body as JSON with 'Content-Type: application/json', not '{content_type}'."
        )
    raw = request.body or b""
    limit = request.app.config.REQUEST_MAX_SIZE  # enforced by Sanic's HTTP/1 server, not ASGI
    if limit and len(raw) > limit:
        raise PayloadTooLargeError(f"The request body is larger than {limit} bytes.")
    if not raw.strip():
        raise BadRequestError("The request body is empty; a JSON object is expected.")
    try:
        data = json_body.parse(raw)
    except json_body.JSONBodyError as exc:
        raise BadRequestError(str(exc)) from None
    if not isinstance(data, dict):
        raise BadRequestError("The request body must be a JSON object.")
    return data


def parse_body(request: Request, model: type[M]) -> M:
    """Parse and validate the JSON body against `model`."""
    return validate(read_json_object(request), model)


def _nul_path(value, path: str = "") -> str | None:
    """Where a NUL character hides in a JSON value (PostgreSQL text cannot hold one)."""
    if isinstance(value, str):
        return (path or "body") if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if "\x00" in key:
                return where
            found = _nul_path(item, where)
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _nul_path(item, f"{path}.{index}" if path else str(index))
            if found:
                return found
    return None


def validate(data: dict, model: type[M]) -> M:
    # Only the fields the model reads: the unknown ones a Body ignores are not stored.
    known = data if model.model_config.get("extra") == "forbid" else {
        key: value for key, value in data.items() if key in model.model_fields
    }
    nul_at = None if getattr(model, "accepts_nul", False) else _nul_path(known)
    if nul_at:
        raise ValidationError.field(nul_at, "must not contain the NUL character")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        detail = [
            {"field": ".".join(str(p) for p in err["loc"]) or "body", "problem": err["msg"]}
            for err in exc.errors(include_url=False)
        ]
        summary = "; ".join(f"{d['field']}: {d['problem']}" for d in detail[:3])
        raise ValidationError(f"Invalid request body: {summary}.", detail=detail) from None
