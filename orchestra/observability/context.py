"""The request and the run the current task works for, for log lines and responses.

Context variables follow a request's task and every task it starts; a run's task sets
its own (`bind_run`), so a line logged while a run executes names that run, whichever
request started it.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("orchestra_request_id", default=None)
run_id: ContextVar[str | None] = ContextVar("orchestra_run_id", default=None)

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def sane_request_id(raw: str | None) -> str:
    """The client's request id when it is 1-128 characters of letters, digits and
    `._:@/+=-`; otherwise a fresh one (32 hex digits). Nothing else reaches a log line
    or a response header."""
    if raw is not None and _SANE_ID.fullmatch(raw):
        return raw
    return os.urandom(16).hex()  # as random as uuid4().hex, at a fifth of its cost


def bind_run(trace_id: str | None) -> None:
    """Mark the current task as working for run `trace_id` (and for no request)."""
    run_id.set(trace_id)
    request_id.set(None)
