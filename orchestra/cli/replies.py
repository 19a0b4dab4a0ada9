"""Where a question is answered: the run that actually waits for it.

A child run's question is shown on its parent's stream (`reply_requested` with
`child_trace_id`), but it is answered on the child's trace (SPEC §14). `send_reply`
sends an answer to the run named — or to the run the event names — and when that run
does not wait for it (409), looks for the question below it: the run of the tree whose
open questions hold the request id (or, with no request id, the one open question of
the tree), and answers there. Used by `workflow reply` and the watch's prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestra.vocabulary import StepStatus

if TYPE_CHECKING:
    from orchestra.client import Client

#: At most this many runs are read looking for the one that waits (a wide tree of children).
MAX_RUNS_READ = 64
_ENDED = {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED, StepStatus.SKIPPED}


def waiting_run(client: Client, trace_id: str, request_id: str | None) -> str | None:
    """The run at or below `trace_id` that waits for `request_id` (any open question when
    None), breadth first; None when none of the runs read does."""
    todo, seen = [trace_id], set()
    while todo and len(seen) < MAX_RUNS_READ:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.add(current)
        record = client.get(f"/workflow/run/{current}")
        body = record.get("run", record)
        pending = [p.get("request_id") for p in body.get("pending_replies") or [] if isinstance(p, dict)]
        if (request_id is None and pending) or (request_id is not None and request_id in pending):
            return current
        todo += [str(step["child_trace_id"]) for step in body.get("steps") or []
                 if isinstance(step, dict) and step.get("child_trace_id") and step.get("status") not in _ENDED]
    return None


def send_reply(client: Client, trace_id: str, content: Any, request_id: str | None,
               *, asked_on: str | None = None) -> str:
    """Answer `request_id` of `trace_id`'s tree; `asked_on` is the run the question's
    event names (a child's `child_trace_id`). Returns the trace id that took the answer;
    raises the first refusal when no run of the tree waits for it."""
    from orchestra.client import APIError

    first = asked_on or trace_id
    try:
        client.reply(first, content, request_id)
        return first
    except APIError as exc:
        if exc.status != 409:
            raise
        target = waiting_run(client, trace_id, request_id)
        if target is None or target == first:
            raise
    client.reply(target, content, request_id)
    return target
