"""The outbox of run events (SPEC §11): when the engine stores a run's terminal event
or a question, a delivery row for each matching subscription is inserted in that same
transaction (the engine's `EventLog` calls `queue` inside it). A crash can then lose
neither: the event and its deliveries are committed together or not at all. Delivering
them is `deliveries.DeliveryLoop`'s job, in whichever process claims them.

The body is fixed here, once: every attempt sends the same bytes under the same
`webhook-id`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from peewee import JOIN

from orchestra.db.models import WorkflowRun, new_id, utcnow
from orchestra.db.trigger_models import EventSubscription, WebhookDelivery
from orchestra.db.workspace_models import Workspace
from orchestra.engine.store.events import Event
from orchestra.vocabulary import DeliveryStatus, EventKind, RunStatus

#: The engine's event kinds that subscribers may hear of, by their subscription name.
EVENT_TYPES: dict[str, str] = {
    EventKind.RUN_FINISHED: "run.succeeded",
    EventKind.RUN_FAILED: "run.failed",
    EventKind.RUN_CANCELLED: "run.cancelled",
    EventKind.REPLY_REQUESTED: "run.waiting_reply",
}
TYPES = tuple(EVENT_TYPES.values())
OUTPUT_MAX_BYTES = 256 * 1024  # a larger output is left out of the body (read the run instead)


def payload(event_type: str, run: WorkflowRun, event: Event) -> str:
    """The delivery's JSON body: `{type, trace_id, template_id, status, output?,
    request_id?, prompt?, ts}`."""
    data = event.data
    status = data.get("status") or (RunStatus.WAITING_REPLY if event_type == "run.waiting_reply" else None)
    body: dict[str, Any] = {"type": event_type, "trace_id": run.trace_id, "template_id": run.template_id,
                            "status": status}
    if event_type == "run.succeeded" and "output" in data:
        text = json.dumps(data["output"], ensure_ascii=False)
        if len(text.encode()) <= OUTPUT_MAX_BYTES:
            body["output"] = data["output"]
    if event_type == "run.failed" and data.get("error"):
        body["error"] = data["error"]
    if event_type == "run.waiting_reply":
        body["request_id"] = data.get("request_id")
        body["prompt"] = data.get("prompt")
    body["ts"] = data.get("ts")
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


class EventOutbox:
    """The engine's outbox hook; `on_queued` is called after the commit (a local wake)."""

    kinds = frozenset(EVENT_TYPES)

    def __init__(self, db: Any, on_queued: Callable[[], None] | None = None) -> None:
        self.db = db
        self.on_queued = on_queued

    async def queue(self, trace_id: str, events: list[Event]) -> None:
        wanted = [(EVENT_TYPES[e.kind], e) for e in events if e.kind in EVENT_TYPES]
        if not wanted:
            return
        run = await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id)
        if run is None:
            return
        # SPEC §16: the owner's personal subscriptions (and those stored before 0021), and
        # those of the run's team workspace
        personal = Workspace.personal.is_null() | (Workspace.personal == True)  # noqa: E712
        team = (EventSubscription.workspace_id == run.workspace_id) & (Workspace.personal == False)  # noqa: E712
        subscriptions = await self.db.list(EventSubscription.select(
            EventSubscription.id, EventSubscription.events, EventSubscription.template
        ).join(Workspace, JOIN.LEFT_OUTER, on=(EventSubscription.workspace_id == Workspace.id))
            .where(((EventSubscription.owner == run.owner_id) & personal) | team))
        now = utcnow()
        rows = []
        for event_type, event in wanted:
            body = None
            for sub in subscriptions:
                if event_type not in sub.events:
                    continue
                if sub.template_id is not None and sub.template_id != run.template_id:
                    continue
                body = body or payload(event_type, run, event)
                rows.append({"subscription": sub.id, "event": event_type, "trace_id": trace_id,
                             "payload": body, "status": DeliveryStatus.PENDING, "attempts": [],
                             "next_attempt_at": now, "created_at": now})
        if not rows:
            return
        for row in rows:
            row["id"] = new_id()
        await self.db.aexecute(WebhookDelivery.insert_many(rows))
        if self.on_queued is not None:
            self.db.after_commit(self.on_queued)
