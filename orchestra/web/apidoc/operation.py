"""`@documented(...)`: what the OpenAPI document says about one route, kept on its handler.

Most of an operation's description is derived, not written: the request body schema
comes from the pydantic model that `parse_body` validates with, the security and the
401/403 answers from `@protected`, the 429 answer from `@rate_limited`, 404 from the
path parameters, 400/413/422 from the body. The decorator adds only what cannot be
derived: the summary, the success model and status, extra error statuses, query
parameters and headers, and links to the operations a response leads to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pydantic

ATTRIBUTE = "__apidoc__"


@dataclass(frozen=True)
class Param:
    """A query parameter or request header."""

    name: str
    where: str  # "query" | "header"
    schema: dict[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True)
class Link:
    """An OpenAPI link from a success response to another operation (by handler name)."""

    target: str  # "<blueprint>.<handler>", e.g. "workflow.get_run"
    parameters: dict[str, str] = field(default_factory=dict)
    request_body: Any = None
    description: str = ""


@dataclass(frozen=True)
class Operation:
    summary: str
    response: type[pydantic.BaseModel] | None = None
    status: int = 200
    body: type[pydantic.BaseModel] | None = None
    request_content: dict[str, Any] | None = None  # a non-JSON body (multipart upload)
    response_content: dict[str, Any] | None = None  # a non-JSON success (download, SSE)
    extra_responses: dict[int, str] = field(default_factory=dict)  # e.g. {204: "…"} besides `status`
    errors: dict[int, str] = field(default_factory=dict)  # statuses beyond the derived ones
    params: tuple[Param, ...] = ()
    path: dict[str, dict[str, Any]] = field(default_factory=dict)  # path parameter schemas
    links: dict[str, Link] = field(default_factory=dict)
    description: str = ""


def documented(summary: str, **details: Any):
    """Decorator: attach an `Operation` to the handler (see the module docstring)."""
    operation = Operation(summary=summary, **details)

    def decorator(handler):
        setattr(handler, ATTRIBUTE, operation)
        return handler

    return decorator


def operation_of(handler) -> Operation | None:
    return getattr(handler, ATTRIBUTE, None)


def query(name: str, description: str, **schema: Any) -> Param:
    return Param(name=name, where="query", schema=schema or {"type": "string"}, description=description)


def header(name: str, description: str, **schema: Any) -> Param:
    return Param(name=name, where="header", schema=schema or {"type": "string"}, description=description)
