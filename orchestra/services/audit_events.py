"""Audit entries as outbound events (SPEC §16, §11): a subscription may take
`audit.*` (every entry of its workspace), `audit.<type>.*` (`audit.template.*`) or one
action (`audit.template.update`). Each entry of a workspace's chain is queued as an
`audit.<action>` delivery to its matching subscriptions in the entry's own transaction
(the outbox of services/outbox.py, sent by `deliveries.DeliveryLoop`): an entry and its
deliveries are committed together, or neither.

The audit log is its admins' to read: a subscription takes `audit.*` events only when
its owner is `admin` or above in its workspace (every user is owner of their personal
one), checked when it is made and again at each entry (one demoted since gets none).
Instance-level entries (logins, instance resources) go to no subscription. A
subscription's `template_id` limits its run events only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from peewee import OP, Expression, Value

from orchestra.db.models import new_id, utcnow
from orchestra.db.trigger_models import EventSubscription, WebhookDelivery
from orchestra.db.workspace_models import Workspace, WorkspaceMember
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action, allows
from orchestra.vocabulary import DeliveryStatus

PREFIX = "audit."
#: `audit.*`, `audit.<type>.*` or `audit.<type>.<verb>` (the OpenAPI document publishes it)
FILTER_PATTERN = r"^audit\.(\*|[a-z_]{1,24}\.(\*|[a-z_]{1,24}))$"
FILTER = re.compile(FILTER_PATTERN)
FILTERS_MAX = 16  # audit filters of one subscription


def is_filter(name: str) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def valid_filter(name: str) -> bool:
    return FILTER.fullmatch(name) is not None


def matches(filters: Iterable[str], event: str) -> bool:
    """Whether an `audit.<action>` event is one a subscription's filters take."""
    for name in filters:
        if name == event or name == "audit.*" or (name.endswith(".*") and event.startswith(name[:-1])):
            return True
    return False


async def _may_read(core: Shared, workspace_id: str, user_ids: set[str]) -> set[str]:
    """Those of `user_ids` who read the workspace's audit log now (admin+; a personal
    workspace's user)."""
    workspace = await core.db.list(Workspace.select(Workspace.personal, Workspace.personal_user)
                                   .where(Workspace.id == workspace_id))
    if workspace and workspace[0].personal:
        return user_ids & {workspace[0].personal_user_id}
    rows = await core.db.list(WorkspaceMember.select(WorkspaceMember.user, WorkspaceMember.role).where(
        (WorkspaceMember.workspace == workspace_id) & WorkspaceMember.user.in_(list(user_ids))))
    return {row.user_id for row in rows if allows(row.role, Action.MANAGE)}


async def listeners(core: Shared, workspace_id: str) -> list[EventSubscription]:
    """The workspace's subscriptions that take audit events and whose owner reads its
    audit log now; none (one indexed read) for most workspaces."""
    subscriptions = await core.db.list(
        EventSubscription.select(EventSubscription.id, EventSubscription.owner, EventSubscription.events)
        .where((EventSubscription.workspace_id == workspace_id)
               & Expression(EventSubscription.events, OP.ILIKE, Value(f'%"{PREFIX}%', converter=False))))
    subscriptions = [s for s in subscriptions if any(is_filter(e) for e in s.events or [])]
    if not subscriptions:
        return []
    readers = await _may_read(core, workspace_id, {s.owner_id for s in subscriptions})
    return [s for s in subscriptions if s.owner_id in readers]


async def queue(core: Shared, subscriptions: list[EventSubscription], entries: list[dict[str, Any]]) -> None:
    """Queue each entry (as the API shows it) to those of `listeners` that take it,
    inside the caller's transaction (the entries')."""
    now, rows = utcnow(), []
    for entry in entries:
        event = PREFIX + entry["action"]
        body = None
        for sub in subscriptions:
            if not matches([e for e in sub.events if is_filter(e)], event):
                continue
            body = body or json.dumps({"type": event, **entry, "ts": entry["at"]},
                                      ensure_ascii=False, separators=(",", ":"))
            rows.append({"id": new_id(), "subscription": sub.id, "event": event, "trace_id": "",
                         "payload": body, "status": DeliveryStatus.PENDING, "attempts": [],
                         "next_attempt_at": now, "created_at": now})
    if rows:
        await core.db.aexecute(WebhookDelivery.insert_many(rows))
        core.db.after_commit(core.delivery_wake.set)
