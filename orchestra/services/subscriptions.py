"""Outbound event subscriptions (SPEC §11): a user's URL, told of their runs' events
(`run.succeeded`, `run.failed`, `run.cancelled`, `run.waiting_reply`), optionally only
of one template's runs, and of its workspace's audit entries (`audit.*`, SPEC §16:
services/audit_events.py). The secret (`whsec_…`, 24 random bytes) is shown once, at
creation, and kept encrypted; it signs every delivery. Queueing is `outbox`, sending
`deliveries`; this module saves subscriptions and shows their deliveries.

A subscription belongs to a workspace (SPEC §16; default its owner's personal one). One
of the owner's personal workspace is told of the owner's runs, as before; one of a team
workspace of that workspace's runs (services/outbox.py). In a team workspace its members
read it and its editors delete it (services/workspace_scope.py).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from orchestra.db.models import iso, utcnow
from orchestra.db.trigger_models import EventSubscription, WebhookDelivery
from orchestra.egress import STEP_SETTING
from orchestra.errors import NotFoundError, ValidationError
from orchestra.services import audit, audit_events, caps, workspace_scope
from orchestra.services.deliveries import webhook_id
from orchestra.services.outbox import TYPES
from orchestra.services.paging import Page, keyset_page
from orchestra.services.providers import BASE_URL
from orchestra.services.run_access import require_runnable
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action
from orchestra.vocabulary import DeliveryStatus

URL_MAX = 2048
DELIVERIES_MAX = 200


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _known_id(value: str) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 36 and "\x00" not in value


async def get_subscription(core: Shared, *, user_id: str, subscription_id: str,
                           action: Action = Action.READ) -> EventSubscription:
    """The caller's subscription, or one of a team workspace by their role there (`action`
    edit: delete, retry a delivery; 403 below it); else 404."""
    row = None
    if _known_id(subscription_id):
        row = await EventSubscription.aget_or_none(EventSubscription.id == subscription_id)
    missing = NotFoundError(f"No subscription has the id '{subscription_id}'.")
    if row is None:
        raise missing
    await workspace_scope.check_owned(core, user_id, row.owner_id, row.workspace_id, action, missing)
    return row


async def check_url(core: Shared, url: str) -> str:
    """The URL stripped; 422 naming `url` (and ORCHESTRA_STEP_EGRESS_ALLOW) when the egress
    rule refuses its host."""
    if not url.strip() or len(url) > URL_MAX or BASE_URL.search(url) is None:
        raise ValidationError.field("url", "must be an http:// or https:// URL whose host is an IP "
                                    "address or an ASCII host name, with an optional port up to 65535")
    url = url.strip()
    refusal = await core.settings.step_egress.url_refusal(url)
    if refusal:
        raise ValidationError(f"url: is refused: {refusal}", detail=[
            {"field": "url", "problem": f"is refused: {refusal}", "setting": STEP_SETTING}])
    return url


def check_events(events: list[str]) -> None:
    """One to four run events and up to FILTERS_MAX audit events (`audit.*`,
    `audit.<type>.*`, `audit.<action>`: services/audit_events.py); 422 naming `events`."""
    runs = [e for e in events if not audit_events.is_filter(e)]
    audits = [e for e in events if audit_events.is_filter(e)]
    if (not events or len(runs) > len(TYPES) or len(audits) > audit_events.FILTERS_MAX
            or any(e not in TYPES for e in runs) or not all(audit_events.valid_filter(e) for e in audits)):
        raise ValidationError.field("events", f"must be one to {len(TYPES)} of {', '.join(TYPES)}, and up to "
                                    f"{audit_events.FILTERS_MAX} audit events (audit.*, audit.<type>.*, "
                                    "audit.<type>.<verb>)")


async def create_subscription(core: Shared, *, user_id: str, url: str, events: list[str],
                              template_id: str | None,
                              workspace_id: str | None = None) -> tuple[EventSubscription, str]:
    """The stored subscription and its secret (shown this once), in `workspace_id` (an
    editor's there, an admin's for audit events; default the caller's personal one); its
    template, if any, of that workspace (or shared)."""
    # the audit log is its admins' (SPEC §16): one check, so a refusal names `admin`
    audits = any(audit_events.is_filter(e) for e in events)
    workspace_id = await workspace_scope.target(core, user_id, workspace_id,
                                                Action.MANAGE if audits else Action.EDIT)
    check_events(events)
    if template_id is not None:
        await require_runnable(core, user_id=user_id, template_ids=[template_id], field="template_id",
                               workspace_id=workspace_id)
    url = await check_url(core, url)
    secret = new_secret()
    async with core.write_transaction():
        await caps.check(core, EventSubscription.select().where(EventSubscription.owner == user_id),
                         setting="max_subscriptions_per_user", what="subscriptions", field="url")
        row = await EventSubscription.acreate(
            owner=user_id, template=template_id, url=url, events=list(dict.fromkeys(events)),
            secret_encrypted=core.secrets.encrypt(secret), created_at=utcnow(), workspace_id=workspace_id)
        await audit.record(core, action="subscription.create", target=_target(row),
                           changes={**audit.diff({}, audited_fields(row)),
                                    "secret": audit.change(None, secret, secret=True)},
                           workspace_id=workspace_id)
    return row, secret


def audited_fields(row: EventSubscription) -> dict[str, Any]:
    """What an audit entry shows of a subscription (SPEC §16); its secret only as "***"."""
    return {"url": row.url, "events": list(row.events), "template_id": row.template_id}


def _target(row: EventSubscription) -> dict[str, Any]:
    """A subscription's entry names it by its URL (it has no name)."""
    return audit.target("subscription", row.id, row.url)


async def list_subscriptions(core: Shared, *, user_id: str, limit: int, cursor: str | None,
                             workspace_id: str | None = None) -> Page[EventSubscription]:
    """The caller's subscriptions and their team workspaces' (`workspace_id`: that one's only)."""
    where = await workspace_scope.owned_where(core, user_id, workspace_id, EventSubscription.owner,
                                              EventSubscription.workspace_id)
    query = EventSubscription.select().where(where)
    return await keyset_page(core.db, query, kind="subscription", at=EventSubscription.created_at,
                             key=EventSubscription.id, limit=limit, cursor=cursor)


async def delete_subscription(core: Shared, *, user_id: str, subscription_id: str) -> None:
    row = await get_subscription(core, user_id=user_id, subscription_id=subscription_id, action=Action.EDIT)
    async with core.write_transaction():
        await core.db.aexecute(WebhookDelivery.delete().where(WebhookDelivery.subscription == row.id))
        if await core.db.aexecute(EventSubscription.delete().where(EventSubscription.id == row.id)):
            await audit.record(core, action="subscription.delete", target=_target(row),
                               changes={**audit.diff(audited_fields(row), {}),
                                        "secret": audit.change(row.secret_encrypted, None, secret=True)},
                               workspace_id=audit.workspace_of(row))


def subscription_view(row: EventSubscription) -> dict[str, Any]:
    """A subscription as shown; never its secret."""
    return {"subscription_id": row.id, "url": row.url, "events": row.events,
            "template_id": row.template_id, "owner_id": row.owner_id, "workspace_id": row.workspace_id,
            "created_at": iso(row.created_at)}


async def list_deliveries(core: Shared, *, user_id: str, subscription_id: str,
                          limit: int = DELIVERIES_MAX) -> list[WebhookDelivery]:
    """The subscription's newest deliveries first."""
    row = await get_subscription(core, user_id=user_id, subscription_id=subscription_id)
    return await core.db.list(WebhookDelivery.select().where(WebhookDelivery.subscription == row.id)
                              .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
                              .limit(limit))


async def retry_delivery(core: Shared, *, user_id: str, subscription_id: str, delivery_id: str) -> WebhookDelivery:
    """Attempt the delivery again now (pending again, whatever it was), same webhook-id.
    Past the retry window (ORCHESTRA_WEBHOOK_RETRY_HOURS) that is one attempt; within it,
    the backoff goes on from there."""
    row = await get_subscription(core, user_id=user_id, subscription_id=subscription_id, action=Action.EDIT)
    where = (WebhookDelivery.id == delivery_id) & (WebhookDelivery.subscription == row.id)
    if not _known_id(delivery_id) or await WebhookDelivery.aget_or_none(where) is None:
        raise NotFoundError(f"No delivery has the id '{delivery_id}'.")
    await core.db.aexecute(WebhookDelivery.update(status=DeliveryStatus.PENDING, next_attempt_at=utcnow()).where(where))
    core.delivery_wake.set()  # this process's delivery loop attempts it now
    return await WebhookDelivery.aget(where)


def delivery_view(row: WebhookDelivery) -> dict[str, Any]:
    return {
        "delivery_id": row.id,
        "webhook_id": webhook_id(row.id),
        "event": row.event,
        "trace_id": row.trace_id or None,  # none for an audit event
        "status": row.status,
        "attempts": list(row.attempts or []),
        "next_attempt_at": iso(row.next_attempt_at),
        "created_at": iso(row.created_at),
    }
