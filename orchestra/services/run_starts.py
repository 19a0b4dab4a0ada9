"""Starts that happen once (SPEC §11): a `POST /run` sent again with the same
`Idempotency-Key`, or a webhook delivered again with the same `webhook-id`, answers the
first run's `trace_id` and starts nothing — for 24 hours, on any number of processes.

The run's transaction also inserts a `run_start_key` row, unique on `(scope, key)`.
Racing duplicates (two processes, one key) both get past the first look-up; the store
lets one insert win, the other's transaction fails on the unique index and rolls back
(its run with it), and that caller answers the winner's `trace_id`. No lock is held
while waiting, and nothing is remembered for a start that failed (a refused request
sent again later is tried afresh).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from peewee import IntegrityError

from orchestra.core import Core
from orchestra.db.access_models import RunStartKey
from orchestra.db.models import WorkflowRun, utcnow
from orchestra.errors import ConflictError, ValidationError

WINDOW = dt.timedelta(hours=24)
KEY_MAX = 255
KEY_PATTERN = r"^[^\u0000-\u001f\u007f]{0,255}$"  # what `idempotency_key` accepts, for the API document
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True, slots=True)
class StartKey:
    """What makes a start unique: `scope` (`user:<id>` or `hook:<id>`) and `key`;
    `fingerprint` (of the request) must match for a replay, when set."""

    scope: str
    key: str
    fingerprint: str | None = None
    field: str = IDEMPOTENCY_HEADER  # what a mismatch's 422 names


@dataclass(frozen=True, slots=True)
class Started:
    trace_id: str
    status: str
    replayed: bool


def fingerprint(value: Any) -> str:
    """SHA-256 of a request's JSON (keys sorted): equal requests, equal prints."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def idempotency_key(raw: str | None) -> str | None:
    """The header's value, or None when absent or empty (HTTP strips a value of spaces to
    nothing: such a request is sent without a key); 422 naming the header when unusable."""
    if not raw:
        return None
    if len(raw) > KEY_MAX or any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise ValidationError.field(
            IDEMPOTENCY_HEADER, f"must be at most {KEY_MAX} characters, none of them a control character")
    return raw


async def remember(core: Core, start: StartKey, trace_id: str) -> None:
    """Inside the run's transaction: the row that makes this start unique (IntegrityError
    when another start of the same key got there first)."""
    await core.db.aexecute(RunStartKey.insert(
        scope=start.scope, key=start.key, fingerprint=start.fingerprint, run=trace_id))


async def _earlier(core: Core, start: StartKey) -> tuple[RunStartKey, str] | None:
    """The remembered start of this key within the window, with its run's status; an
    older one is forgotten here (its key may start a run again)."""
    rows = await core.db.list(
        RunStartKey.select(RunStartKey, WorkflowRun.trace_id, WorkflowRun.status)
        .join(WorkflowRun, on=(RunStartKey.run == WorkflowRun.trace_id))
        .where((RunStartKey.scope == start.scope) & (RunStartKey.key == start.key))
    )
    if not rows:
        return None
    row = rows[0]
    if row.created_at < utcnow() - WINDOW:
        await core.db.aexecute(RunStartKey.delete().where(
            (RunStartKey.id == row.id) & (RunStartKey.created_at < utcnow() - WINDOW)))
        return None
    if start.fingerprint is not None and row.fingerprint != start.fingerprint:
        raise ValidationError.field(
            start.field, "was already used with a different request body (within 24 hours)")
    return row, row.run.status


async def start_once(
    core: Core, start: StartKey, begin: Callable[[], Awaitable[WorkflowRun]], *,
    look_first: bool = True,
) -> Started:
    """Start a run with `begin()` (which must call `remember` in its transaction) unless
    this key already started one; then the earlier run, `replayed`.

    `look_first` reads the remembered start before beginning (an Idempotency-Key: a replay
    must answer even if the request could no longer start a run, its template deleted).
    Without it (webhooks: most calls are first deliveries) the insert itself finds the
    duplicate, and a first delivery costs one round trip less."""
    if look_first:
        earlier = await _earlier(core, start)
        if earlier is not None:
            return Started(earlier[0].run.trace_id, earlier[1], True)
    for _ in range(2):  # a second time only after forgetting an expired start of this key
        try:
            run = await begin()
        except IntegrityError:
            earlier = await _earlier(core, start)
            if earlier is not None:
                return Started(earlier[0].run.trace_id, earlier[1], True)
            continue  # it had expired (now forgotten), or its run was deleted meanwhile
        return Started(run.trace_id, run.status, False)
    raise ConflictError("This start could not be stored; send it again.")


async def prune(core: Core, *, now: dt.datetime | None = None) -> int:
    """Forget starts older than the window (retention does this hourly)."""
    return await core.db.aexecute(
        RunStartKey.delete().where(RunStartKey.created_at < (now or utcnow()) - WINDOW))
