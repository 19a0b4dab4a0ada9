"""Answer shapes of schedules and event subscriptions (SPEC §11), for the OpenAPI document."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from orchestra import vocabulary
from orchestra.services.audit_events import FILTER_PATTERN
from orchestra.web.apidoc.models import NextCursor, Shape, Success, Timestamp

Outcome = Literal[tuple(o.value for o in vocabulary.FireOutcome)]  # type: ignore[valid-type]
DeliveryStatus = Literal[tuple(s.value for s in vocabulary.DeliveryStatus)]  # type: ignore[valid-type]
RUN_EVENTS = ("run.succeeded", "run.failed", "run.cancelled", "run.waiting_reply")
EventType = Literal[RUN_EVENTS]  # type: ignore[valid-type]
#: a run event, or an audit filter (SPEC §16): audit.*, audit.<type>.*, audit.<type>.<verb>
EVENT_SCHEMA = {"anyOf": [{"type": "string", "enum": list(RUN_EVENTS)},
                          {"type": "string", "pattern": FILTER_PATTERN}]}
Offset = Field(description="ISO 8601 with the offset of the schedule's zone at that instant.")


class LastFire(Shape):
    due_at: str = Field(description="ISO 8601 with the offset of the schedule's zone at that instant.")
    trace_id: str | None = Field(description="The run it started (outcome started).")
    outcome: Outcome
    error: str | None = Field(None, description="Why it did not start a run (skipped, missed, failed).")


class ScheduleView(Shape):
    schedule_id: str
    template_id: str
    owner_id: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16).")
    cron: str = Field(description="Five fields, normalized to single spaces.")
    timezone: str
    input: Any = None
    overlap: Literal["skip", "allow", "cancel_previous"]
    catchup: Literal["none", "latest", "all"]
    catchup_window_seconds: int
    enabled: bool
    next_fires: list[str] = Field(description="The next 5 due times (empty when disabled), ISO 8601 "
                                  "with the offset of the schedule's zone at each instant.")
    last_fire: LastFire | None
    created_at: Timestamp
    updated_at: Timestamp


class Schedule(Success):
    schedule_id: str
    schedule: ScheduleView


class ScheduleList(Success):
    schedules: list[ScheduleView]
    next_cursor: str | None = NextCursor()


class FireView(Shape):
    due_at: str = Field(description="The due time handled, ISO 8601 with the offset of the schedule's zone.")
    fired_at: str = Field(description="When a process handled it (same zone).")
    outcome: Outcome = Field(description="started (a run), skipped (overlap), missed (catch-up policy) "
                             "or failed (the run could not start: error).")
    trace_id: str | None = Field(description="The run it started (outcome started).")
    run_status: str | None = Field(description="That run's status now; null without a run, or once "
                                   "the run was deleted.")
    error: str | None = Field(description="Why it did not start a run (skipped, missed, failed).")


class FireList(Success):
    schedule_id: str
    timezone: str
    fires: list[FireView] = Field(description="Newest due time first.")
    next_cursor: str | None = NextCursor()


class SubscriptionView(Shape):
    subscription_id: str
    url: str
    events: list[str] = Field(description="Run events, and audit filters (audit.*, audit.<type>.*, "
                              "audit.<type>.<verb>).", json_schema_extra={"items": EVENT_SCHEMA})
    template_id: str | None
    owner_id: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16).")
    created_at: Timestamp


class SubscriptionCreated(Success):
    subscription_id: str
    secret: str = Field(description="whsec_…: shown this once; verifies the signatures.")
    subscription: SubscriptionView


class Subscription(Success):
    subscription_id: str
    subscription: SubscriptionView


class SubscriptionList(Success):
    subscriptions: list[SubscriptionView]
    next_cursor: str | None = NextCursor()


class Attempt(Shape):
    at: Timestamp
    response_code: int | None = Field(description="null when no answer came (error says why).")
    error: str | None


class DeliveryView(Shape):
    delivery_id: str
    webhook_id: str = Field(description="The webhook-id header of every attempt.")
    event: str = Field(description="A run event, or audit.<action> (an audit entry).",
                       json_schema_extra={"anyOf": [{"enum": list(RUN_EVENTS)},
                                                    {"pattern": r"^audit\.[a-z_]+\.[a-z_]+$"}]})
    trace_id: str | None = Field(description="The run whose event it is; null for an audit event.")
    status: DeliveryStatus
    attempts: list[Attempt]
    next_attempt_at: Timestamp | None
    created_at: Timestamp


class DeliveryList(Success):
    deliveries: list[DeliveryView]


class Delivery(Success):
    delivery: DeliveryView
