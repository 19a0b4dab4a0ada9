"""Keyset paging of lists that grow (runs, templates, workers, files).

A page is read as `ORDER BY <time>, <id>` from where the previous page ended, never by
OFFSET, so page 200 costs what page 1 costs (an index on the order serves it). The cursor
handed to the client names the list, the last row's time (microseconds since 1970, UTC)
and its id: `run.1767268800000000.<id>`. Its form is published (`cursor_pattern`) and any
cursor of that form is a position in the list: the page holds the rows after it. A
cursor of another form, or made for another list, is a 422 on the `cursor` field.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from peewee import Field, ModelSelect, Tuple

from orchestra.errors import ValidationError

T = TypeVar("T")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_BAD = "is not a cursor of this list (use next_cursor of a previous page, or leave it out)"
_EPOCH = dt.datetime(1970, 1, 1)
KEY_PATTERN = r"[A-Za-z0-9_-]{1,64}"  # ids are UUIDs; any such string is a position


def cursor_pattern(kind: str) -> str:
    """The form of a cursor of the list `kind`: 17 digits at most keep the time within
    what both stores hold (year 5138)."""
    return rf"^{re.escape(kind)}\.[0-9]{{1,17}}\.{KEY_PATTERN}$"


@dataclass(frozen=True)
class Page(Generic[T]):
    rows: list[T]
    next_cursor: str | None  # None: this is the last page


def encode_cursor(kind: str, at: dt.datetime, key: str) -> str:
    micros = (at.replace(tzinfo=None) - _EPOCH) // dt.timedelta(microseconds=1)
    return f"{kind}.{micros}.{key}"


def decode_cursor(kind: str, cursor: str) -> tuple[dt.datetime, str]:
    """(time, id) of a cursor of the form `cursor_pattern(kind)`; 422 for anything else."""
    # search, as JSON Schema reads a pattern (Python's `$` also matches before a final \n)
    if not cursor.isascii() or re.search(cursor_pattern(kind), cursor) is None:
        raise ValidationError.field("cursor", _BAD)
    _, micros, key = cursor.rstrip("\n").split(".", 2)
    return _EPOCH + dt.timedelta(microseconds=int(micros)), key


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
