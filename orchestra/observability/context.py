"""The request and the run the current task works for, for log lines and responses.

Context variables follow a request's task and every task it starts; a run's task sets
its own (`bind_run`), so a line logged while a run executes names that run, whichever
request started it.
"""

from __future__ import annotations

import itertools
import os
import re
from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("orchestra_request_id", default=None)
run_id: ContextVar[str | None] = ContextVar("orchestra_run_id", default=None)

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def _new_id_prefix() -> None:
    global _id_prefix
    _id_prefix = os.urandom(8).hex()


# A fresh request id is this process's random prefix and a counter: unique across
# processes and restarts (64 random bits each), and a few percent of a small request's
# CPU cheaper than uuid4() (which reads the kernel's random source every time).
_id_prefix = ""
_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)
_id_numbers = itertools.count()


def sane_request_id(raw: str | None) -> str:
    """The client's request id when it is 1-128 characters of letters, digits and
    `._:@/+=-`; otherwise a fresh one (32 hex digits). Nothing else reaches a log line
    or a response header."""
    if raw is not None and _SANE_ID.fullmatch(raw):
        return raw
    return f"{_id_prefix}{next(_id_numbers) & 0xFFFFFFFFFFFFFFFF:016x}"


def bind_run(trace_id: str | None) -> None:
    """Mark the current task as working for run `trace_id` (and for no request)."""
    run_id.set(trace_id)
    request_id.set(None)
