"""Query parameters of paged lists: `limit`, `cursor` (and the events' `after`), strictly.

An empty value (`?cursor=`) is not a value: it is a 422 naming the parameter, like any
other value the document does not allow; leave the parameter out instead.
"""

from __future__ import annotations

from typing import Any

from sanic import Request

from orchestra.errors import ValidationError
from orchestra.services.paging import DEFAULT_LIMIT, MAX_LIMIT, Page, cursor_pattern
from orchestra.web.apidoc.operation import Param, query
from orchestra.web.responses import SUCCESS

# The list each parameter name pages, as the services name it in their cursors.
_KINDS = {"runs": "run", "templates": "template", "workers": "worker", "files": "file",
          "schedules": "schedule", "subscriptions": "subscription",
          "fires": "fire", "entries": "audit"}


def raw_arg(request: Request, name: str) -> str | None:
    """The query value as sent (None when absent, "" when blank; Sanic's `args` drop blank
    values, which would let `?after=` pass for a number)."""
    values = request.get_args(keep_blank_values=True).get(name)
    return None if values is None else values[0] if isinstance(values, list) else values


def workspace_arg(request: Request) -> str | None:
    """`?workspace_id=` of a list (SPEC §16): None when absent; a blank one is 422 naming
    it (it is no workspace, and the published pattern refuses it)."""
    raw = raw_arg(request, "workspace_id")
    if raw is not None and not raw.strip():
        raise ValidationError.field("workspace_id", "must be a workspace_id (leave it out for all of yours)")
    return raw


def count_arg(request: Request, name: str, *, default: int, low: int, high: int) -> int:
    """A whole number from `low` to `high` (ASCII digits only), `default` when absent."""
    raw = raw_arg(request, name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18 or not low <= int(raw) <= high:
        raise ValidationError.field(name, f"must be an integer from {low} to {high}")
    return int(raw)


def page_args(request: Request, *, default: int = DEFAULT_LIMIT) -> tuple[int, str | None]:
    """(limit, cursor) of a paged list."""
    limit = count_arg(request, "limit", default=default, low=1, high=MAX_LIMIT)
    cursor = raw_arg(request, "cursor")
    if cursor is not None and (not cursor or len(cursor) > 512):
        raise ValidationError.field("cursor", "must be the next_cursor of a previous page")
    return limit, cursor


def page_params(what: str, default: int = DEFAULT_LIMIT) -> tuple[Param, Param]:
    """The document's `limit` and `cursor` parameters of a paged list."""
    return (
        query("limit", f"At most this many {what} (default {default}).",
              type="integer", minimum=1, maximum=MAX_LIMIT),
        query("cursor", "Where the previous page ended: its next_cursor. Any cursor of this "
              "form is a position in the list (the page holds the rows after it).",
              type="string", pattern=cursor_pattern(_KINDS[what])),
    )


PAGE_ERRORS = "ValidationError: limit out of range, or a cursor not of this list's form."


def page_body(key: str, items: list[Any], page: Page) -> dict[str, Any]:
    """A paged list's answer: this page's `items` under `key`, and where the next starts."""
    return {"message": SUCCESS, key: items, "next_cursor": page.next_cursor}
