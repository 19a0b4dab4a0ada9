"""Keyset paging of lists that grow (runs, templates, workers, files).

A page is read as `ORDER BY <time>, <id>` from where the previous page ended, never by
OFFSET, so page 200 costs what page 1 costs (an index on the order serves it). The cursor
handed to the client is opaque: base64url of a small JSON array naming the list, the last
row's time and its id. A cursor this server did not make, or made for another list, is a
422 on the `cursor` field.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from peewee import Field, ModelSelect, Tuple

from orchestra.errors import ValidationError

T = TypeVar("T")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_BAD = "is not a cursor of this list (use next_cursor of a previous page, or leave it out)"


@dataclass(frozen=True)
class Page(Generic[T]):
    rows: list[T]
    next_cursor: str | None  # None: this is the last page


def encode_cursor(kind: str, at: dt.datetime, key: str) -> str:
    raw = json.dumps([kind, at.isoformat(), key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(kind: str, cursor: str) -> tuple[dt.datetime, str]:
    """(time, id) of a cursor made by `encode_cursor(kind, …)`; 422 for anything else."""
    try:
        if len(cursor) > 512 or not cursor.isascii():
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        made_for, at, key = json.loads(raw)
        if made_for != kind or not isinstance(at, str) or not isinstance(key, str) or len(key) > 64:
            raise ValueError
        return dt.datetime.fromisoformat(at), key
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValidationError.field("cursor", _BAD) from None


async def keyset_page(
    db: Any,
    query: ModelSelect,
    *,
    kind: str,
    at: Field,
    key: Field,
    limit: int,
    cursor: str | None,
    newest_first: bool = False,
) -> Page:
    """One page of `query` ordered by (`at`, `key`), oldest first or newest first (both
    columns in the one direction, so one index scan, forwards or backwards, serves it).
    `db.list` runs the query; `limit + 1` rows tell whether another page follows."""
    if cursor is not None:
        position, last = Tuple(at, key), Tuple(*decode_cursor(kind, cursor))
        query = query.where(position < last if newest_first else position > last)
    order = (at.desc(), key.desc()) if newest_first else (at.asc(), key.asc())
    rows = await db.list(query.order_by(*order).limit(limit + 1))
    if len(rows) <= limit:
        return Page(rows, None)
    rows = rows[:limit]
    last = rows[-1]
    return Page(rows, encode_cursor(kind, getattr(last, at.name), getattr(last, key.name)))
