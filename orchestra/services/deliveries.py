"""Delivering the outbox (SPEC §11): every server process runs a `DeliveryLoop`; each
pending delivery is attempted by one process at a time.

A process claims due deliveries in a short transaction (`FOR UPDATE SKIP LOCKED` on
PostgreSQL), stamping them with its own `claim_token` and a `claim_until`; it then
sends them with no store connection held, and records each outcome with an update
conditioned on that token (fenced): a process that stalled past its claim, while
another took the delivery over, writes nothing. A process killed mid-attempt leaves the
claim to run out (CLAIM_SECONDS); the delivery is then attempted again, with the same
`webhook-id` and body.

Each attempt is signed per Standard Webhooks (the `standardwebhooks` package):
`webhook-id` is `msg_<delivery_id>` on every attempt, `webhook-timestamp` the attempt's
time, `webhook-signature` `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`. A 2xx
answer ends it; anything else (another status, a refused or failed connection, a
timeout) is retried after 5 s, 10 s, 20 s … at most an hour apart, for
ORCHESTRA_WEBHOOK_RETRY_HOURS from the event, then the delivery is `failed`. Every
connection obeys the users' egress rule (ORCHESTRA_STEP_EGRESS_ALLOW); no redirect is
followed.

Deliveries to one destination host are paced (SPEC §15b): a process sends at most
ORCHESTRA_DELIVERY_HOST_RATE a second to one host (`HostPacer`), so many subscriptions
to one target cannot turn one run into a burst of signed POSTs. A claimed delivery whose
host has no free turn within PACE_WAIT_MAX is handed back, due when the host's next
turn frees (no attempt is counted), and claimed again then.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any
from urllib.parse import urlsplit

import httpx2
from peewee import fn
from standardwebhooks.webhooks import Webhook

from orchestra.backoff import Backoff
from orchestra.db.models import new_id, utcnow
from orchestra.db.outage import STORE_RETRY, StoreOutage, keep_going, release_quietly
from orchestra.db.trigger_models import EventSubscription, WebhookDelivery
from orchestra.egress import STEP_SETTING, find_refusal
from orchestra.services.shared import Shared
from orchestra.tls import client_tls
from orchestra.vocabulary import DeliveryStatus

logger = logging.getLogger("orchestra.deliveries")

BATCH = 20  # deliveries claimed at once
CONCURRENCY = 10  # attempts in flight per process
ATTEMPT_TIMEOUT = 15.0  # seconds for one attempt (connect, send, the answer's head)
CLAIM_SECONDS = 30.0  # a claim outlives any attempt (ATTEMPT_TIMEOUT); past it another process takes over
IDLE_SECONDS = 5.0  # the longest sleep (deliveries queued by other processes are seen by then)
FIRST_RETRY_SECONDS = 5.0
RETRY_CAP_SECONDS = 3600.0
ATTEMPTS_KEPT = 50  # the newest attempts kept on a delivery
ERROR_MAX = 300


PACE_WAIT_MAX = 1.0  # seconds an attempt may wait for its host's turn; longer: handed back
PACER_HOSTS_MAX = 10_000  # hosts remembered; past it, those whose turns are all past go


class HostPacer:
    """Turns per destination host, `rate` a second: `take` books the next turn (the
    seconds to wait for it) when it is within `most` seconds, else books nothing and
    answers -(seconds until the host's next free turn)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self._next: dict[str, float] = {}

    def take(self, host: str, *, most: float = PACE_WAIT_MAX) -> float:
        now = time.monotonic()
        turn = max(now, self._next.get(host, now))
        if turn - now > most:
            return -(turn - now)
        self._next[host] = turn + self.interval
        if len(self._next) > PACER_HOSTS_MAX:
            self._next = {h: t for h, t in self._next.items() if t > now}
        return turn - now


def host_of(url: str) -> str:
    return (urlsplit(url).hostname or url).lower()


def webhook_id(delivery_id: str) -> str:
    return f"msg_{delivery_id}"


RETRIES = Backoff(base=FIRST_RETRY_SECONDS, cap=RETRY_CAP_SECONDS)


def retry_delay(failures: int) -> float:
    """Seconds before the next attempt after `failures` failed ones: 5 s doubled per
    failure up to an hour, less up to a fifth (orchestra/backoff.py)."""
    return RETRIES.delay(failures)


class DeliveryLoop:
    """This process's delivery loop; started and stopped by the process owner (process.py).
    `core.delivery_wake` cuts its sleep short (a delivery queued or retried here)."""

    def __init__(self, core: Shared) -> None:
        self.core = core
        self.outage: StoreOutage = core.outage
        self.task: asyncio.Task | None = None
        self._wake = core.delivery_wake
        self._stopping = False
        self._client: httpx2.AsyncClient | None = None
        self.pacer = HostPacer(core.settings.delivery_host_rate)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop(), name="webhook-deliveries")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming; attempts in flight get ATTEMPT_TIMEOUT to finish (else their
        claims run out and another process tries again)."""
        self._stopping = True
        self._wake.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout=ATTEMPT_TIMEOUT + 2)
            except TimeoutError:
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    @property
    def client(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(
                timeout=ATTEMPT_TIMEOUT, follow_redirects=False,
                transport=self.core.settings.step_egress.transport(verify=client_tls()),
                headers={"User-Agent": "orchestra-webhooks"},
            )
        return self._client

    async def _loop(self) -> None:
        await keep_going(self._round, what="delivering webhooks", db=self.core.db,
                         outage=self.outage, wake=self._wake, stopping=lambda: self._stopping)

    async def _round(self) -> float:
        claimed = await self.claim()
        await release_quietly(self.core.db)
        if claimed:
            await self.attempt_all(claimed)
        return 0.0 if len(claimed) >= BATCH else await self._seconds_to_next()

    async def _seconds_to_next(self) -> float:
        rows = await self.core.db.list(
            WebhookDelivery.select(fn.MIN(WebhookDelivery.next_attempt_at).alias("due"))
            .where(WebhookDelivery.status == DeliveryStatus.PENDING).dicts())
        due = rows[0]["due"] if rows else None
        if due is None:
            return IDLE_SECONDS
        if isinstance(due, str):
            due = dt.datetime.fromisoformat(due)
        # A due delivery another process holds: look again shortly, not at once.
        return max(0.2, min(IDLE_SECONDS, (due - utcnow()).total_seconds()))

    async def claim(self) -> list[tuple[WebhookDelivery, EventSubscription, str]]:
        """Due pending deliveries nobody holds, now held by this process (with its token)."""
        core = self.core
        now = utcnow()
        token = new_id()
        async with core.write_transaction():
            query = (WebhookDelivery.select()
                     .where((WebhookDelivery.status == DeliveryStatus.PENDING) & (WebhookDelivery.next_attempt_at <= now)
                            & (WebhookDelivery.claim_until.is_null() | (WebhookDelivery.claim_until < now)))
                     .order_by(WebhookDelivery.next_attempt_at).limit(BATCH))
            if core.is_postgres:
                query = query.for_update(skip_locked=True)
            rows = await core.db.list(query)
            if not rows:
                return []
            await core.db.aexecute(WebhookDelivery.update(
                claim_token=token, claim_until=now + dt.timedelta(seconds=CLAIM_SECONDS)
            ).where(WebhookDelivery.id.in_([r.id for r in rows])))
            subs = {s.id: s for s in await core.db.list(EventSubscription.select().where(
                EventSubscription.id.in_(list({r.subscription_id for r in rows}))))}
        return [(row, subs[row.subscription_id], token) for row in rows if row.subscription_id in subs]

    async def attempt_all(self, claimed: list[tuple[WebhookDelivery, EventSubscription, str]]) -> None:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(row: WebhookDelivery, sub: EventSubscription, token: str) -> None:
            wait = self.pacer.take(host_of(sub.url))
            if wait < 0:  # its host has no turn soon: back to the store, due at that turn
                await self.postpone(row, token, -wait)
                return
            if wait:
                await asyncio.sleep(wait)  # no store connection is held here
            async with gate:
                outcome = await self.send(row, sub)
                await self.record(row, token, outcome)

        await asyncio.gather(*(one(*item) for item in claimed))

    async def send(self, row: WebhookDelivery, sub: EventSubscription) -> dict[str, Any]:
        """One attempt, with no store connection held: `{at, response_code, error}`."""
        at = dt.datetime.now(dt.UTC)
        message_id = webhook_id(row.id)
        try:
            secret = self.core.secrets.decrypt(sub.secret_encrypted)
            signature = Webhook(secret).sign(message_id, at, row.payload)
        except Exception:  # noqa: BLE001 - a secret that cannot be read (a changed SECRET_KEY)
            return _attempt(at, None, "the subscription's secret cannot be read (was ORCHESTRA_SECRET_KEY changed?)")
        headers = {
            "content-type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature,
        }
        try:
            request = self.client.build_request("POST", sub.url, content=row.payload.encode(), headers=headers)
            response = await self.client.send(request, stream=True)
            await response.aclose()  # the answer's body is not read
        except httpx2.HTTPError as exc:
            refused = find_refusal(exc)
            if refused is not None:
                return _attempt(at, None, f"{refused} (setting: {STEP_SETTING})")
            if isinstance(exc, httpx2.TimeoutException):
                return _attempt(at, None, f"no answer within {ATTEMPT_TIMEOUT:g} s")
            return _attempt(at, None, f"could not connect: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a URL httpx cannot use
            return _attempt(at, None, f"could not send: {type(exc).__name__}: {exc}")
        error = None if 200 <= response.status_code < 300 else f"answered {response.status_code}"
        return _attempt(at, response.status_code, error)

    async def postpone(self, row: WebhookDelivery, token: str, seconds: float) -> None:
        """Hand a claimed delivery back unattempted, due in `seconds` (fenced on the claim)."""
        due = utcnow() + dt.timedelta(seconds=seconds)
        try:
            await self.core.db.aexecute(WebhookDelivery.update(
                next_attempt_at=due, claim_token=None, claim_until=None).where(
                (WebhookDelivery.id == row.id) & (WebhookDelivery.claim_token == token)))
        except Exception as exc:  # noqa: BLE001 - the claim runs out, and it is tried then
            if not self.outage.failed(exc, "postponing a webhook delivery"):
                logger.warning("could not postpone delivery %s: %s", row.id, exc)
        finally:
            await release_quietly(self.core.db)

    async def record(self, row: WebhookDelivery, token: str, attempt: dict[str, Any]) -> bool:
        """Store the attempt's outcome, fenced on the claim; whether it was stored."""
        attempts = [*list(row.attempts or []), attempt][-ATTEMPTS_KEPT:]
        now = utcnow()
        values: dict[str, Any] = {"attempts": attempts, "claim_token": None, "claim_until": None}
        if attempt["error"] is None:
            values.update(status=DeliveryStatus.DELIVERED, next_attempt_at=None)
        else:
            failures = sum(1 for a in attempts if a["error"] is not None)
            following = now + dt.timedelta(seconds=retry_delay(failures))
            give_up = row.created_at + dt.timedelta(hours=self.core.settings.webhook_retry_hours)
            if following > give_up:
                values.update(status=DeliveryStatus.FAILED, next_attempt_at=None)
            else:
                values.update(next_attempt_at=following)
        for tries in range(1, 1000):
            try:
                stored = await self.core.db.aexecute(WebhookDelivery.update(**values).where(
                    (WebhookDelivery.id == row.id) & (WebhookDelivery.claim_token == token)))
                await release_quietly(self.core.db)
                return bool(stored)
            except Exception as exc:  # noqa: BLE001 - an outage: keep the outcome until the store is back
                if not self.outage.failed(exc, "recording a webhook delivery") or self._stopping:
                    return False
                await STORE_RETRY.sleep(tries)
        return False


def _attempt(at: dt.datetime, code: int | None, error: str | None) -> dict[str, Any]:
    text = at.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
    return {"at": text, "response_code": code, "error": None if error is None else error[:ERROR_MAX]}
