"""Retention of what schedules and subscriptions leave behind (SPEC §10, §11): fire
records (`schedule_fire`, one per handled due time) and ended deliveries
(`webhook_delivery`, delivered or failed) older than ORCHESTRA_RUN_RETENTION_DAYS go
with the runs of that age, in small batches. A pending delivery is never deleted.
"""

from __future__ import annotations

import datetime as dt

from orchestra.db.database import release_connection
from orchestra.db.trigger_models import ScheduleFire, WebhookDelivery
from orchestra.services.shared import Shared
from orchestra.vocabulary import DeliveryStatus

BATCH = 1000


async def prune(core: Shared, *, cutoff: dt.datetime) -> int:
    """Delete fire records due and ended deliveries made before `cutoff`; how many."""
    total = 0
    for model, old in (
        (ScheduleFire, ScheduleFire.due_at < cutoff),
        (WebhookDelivery, (WebhookDelivery.created_at < cutoff) & (WebhookDelivery.status != DeliveryStatus.PENDING)),
    ):
        while True:
            ids = [row.id for row in await core.db.list(model.select(model.id).where(old).limit(BATCH))]
            if ids:
                async with core.write_transaction():
                    await core.db.aexecute(model.delete().where(model.id.in_(ids)))
            await release_connection(core.db)
            total += len(ids)
            if len(ids) < BATCH:
                break
    return total
