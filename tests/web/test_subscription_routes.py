"""`/api/v1/workflow/subscription` in process, on both stores, with a real receiving
HTTP server on loopback: the outbox row is stored with the run's event, the delivery is
signed per Standard Webhooks (verified here with the `standardwebhooks` package), retried
with the same webhook-id, listed with its response codes, and retried by hand."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from orchestra.db.models import RunEvent, utcnow
from orchestra.db.trigger_models import EventSubscription, WebhookDelivery
from tests.conftest import LOOPBACK_STEPS
from tests.fakes.webhook_receiver import WebhookReceiver

API = "/api/v1/workflow"


@pytest.fixture
def settings_overrides():
    return dict(LOOPBACK_STEPS)  # the receivers listen on loopback (SPEC §15b: the users' rule)


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
async def worker(alice, make_worker):
    return await make_worker(alice, [])


async def make_template(client, who, steps, name="t"):
    response = await client.post(f"{API}/template", headers=who["headers"], json={"name": name, "steps": steps})
    assert response.status_code == 201, response.text
    return response.json()["template_id"]


@pytest.fixture
async def template(client, alice, worker):
    return await make_template(client, alice, [{"id": "a", "agent": {"worker": worker}, "prompt": "Say {{input}}"}])


def assert_error(response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and body["message"]
    return body


async def subscribe(client, who, **body):
    response = await client.post(f"{API}/subscription", headers=who["headers"], json=body)
    assert response.status_code == 201, response.text
    return response.json()


async def run(client, who, template_id, text="hi"):
    started = await client.post(f"{API}/run", headers=who["headers"], json={"template_id": template_id, "input": text})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    for _ in range(400):
        body = (await client.get(f"{API}/run/{trace_id}", headers=who["headers"])).json()
        if body["status"] in ("succeeded", "failed", "cancelled", "waiting_reply"):
            return body
        await asyncio.sleep(0.025)
    raise AssertionError(body["status"])


async def personal_id(client, who) -> str:
    spaces = (await client.get("/api/v1/workspace", headers=who["headers"])).json()["workspaces"]
    return next(w["workspace_id"] for w in spaces if w["personal"])


async def received(hook: WebhookReceiver, count: int, timeout: float = 10.0):
    return await asyncio.to_thread(hook.wait_for, count, timeout)


async def test_a_succeeded_run_is_delivered_signed(client, alice, template, caplog):
    caplog.set_level(logging.DEBUG)
    with WebhookReceiver() as hook:
        made = await subscribe(client, alice, url=hook.url, events=["run.succeeded", "run.failed"])
        secret = made["secret"]
        assert secret.startswith("whsec_") and len(secret) > 30
        sid = made["subscription_id"]
        assert made["subscription"] == {"subscription_id": sid, "url": hook.url,
                                        "events": ["run.succeeded", "run.failed"], "template_id": None,
                                        "owner_id": alice["user_id"], "created_at": made["subscription"]["created_at"],
                                        "workspace_id": await personal_id(client, alice)}
        got = (await client.get(f"{API}/subscription/{sid}", headers=alice["headers"])).json()
        assert "secret" not in json.dumps(got) and got["subscription"] == made["subscription"]
        stored = await EventSubscription.aget(EventSubscription.id == sid)
        assert secret not in stored.secret_encrypted
        done = await run(client, alice, template)
        assert done["status"] == "succeeded"
        (request,) = await received(hook, 1)
        payload = Webhook(secret).verify(request.body, request.headers)
        assert payload["type"] == "run.succeeded" and payload["trace_id"] == done["trace_id"]
        assert payload["template_id"] == template and payload["status"] == "succeeded"
        assert payload["output"] == done["steps"][0]["output"] and payload["ts"]
        assert request.headers["webhook-id"].startswith("msg_")
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(request.body.replace("succeeded", "failed"), request.headers)
        for _ in range(100):
            deliveries = (await client.get(f"{API}/subscription/{sid}/deliveries", headers=alice["headers"])).json()
            if deliveries["deliveries"][0]["status"] == "delivered":
                break
            await asyncio.sleep(0.05)
        (delivery,) = deliveries["deliveries"]
        assert delivery["status"] == "delivered" and delivery["event"] == "run.succeeded"
        assert delivery["webhook_id"] == request.headers["webhook-id"] and delivery["next_attempt_at"] is None
        assert [(a["response_code"], a["error"]) for a in delivery["attempts"]] == [(200, None)]
    assert secret not in caplog.text


async def test_the_outbox_row_is_stored_with_the_event(client, alice, template):
    made = await subscribe(client, alice, url="http://127.0.0.1:9/none", events=["run.succeeded"])
    done = await run(client, alice, template)
    rows = await WebhookDelivery._meta.database.list(WebhookDelivery.select())
    assert [(r.subscription_id, r.trace_id, r.event) for r in rows] == [(made["subscription_id"], done["trace_id"], "run.succeeded")]
    end = await RunEvent.aget((RunEvent.run == done["trace_id"]) & (RunEvent.kind == "run_finished"))
    assert abs((rows[0].created_at - end.created_at).total_seconds()) < 5


async def test_failures_are_retried_with_the_same_webhook_id(client, alice, template):
    with WebhookReceiver(statuses=[500, 503, 404]) as hook:
        made = await subscribe(client, alice, url=hook.url, events=["run.succeeded"])
        sid = made["subscription_id"]
        await run(client, alice, template)
        loop = client.app.ctx.process.deliveries
        for count in range(1, 5):
            await received(hook, count)
            for _ in range(100):  # the attempt is recorded; its retry waits ~5 s, 10 s …
                row = (await WebhookDelivery._meta.database.list(WebhookDelivery.select()))[0]
                if len(row.attempts) == count:
                    break
                await asyncio.sleep(0.02)
            if count < 4:
                wait = (row.next_attempt_at - utcnow()).total_seconds()
                assert row.status == "pending" and 0 < wait <= 30 * 2 ** (count - 1)
                await WebhookDelivery._meta.database.aexecute(  # as if that time had passed
                    WebhookDelivery.update(next_attempt_at=utcnow()).where(WebhookDelivery.id == row.id))
                loop.wake()
        ids = {r.headers["webhook-id"] for r in hook.received}
        bodies = {r.body for r in hook.received}
        assert len(hook.received) == 4 and len(ids) == 1 and len(bodies) == 1
        deliveries = (await client.get(f"{API}/subscription/{sid}/deliveries", headers=alice["headers"])).json()
        (delivery,) = deliveries["deliveries"]
        assert delivery["status"] == "delivered"
        assert [a["response_code"] for a in delivery["attempts"]] == [500, 503, 404, 200]
        # A manual retry tries again now, with the same webhook-id.
        again = await client.post(f"{API}/subscription/{sid}/deliveries/{delivery['delivery_id']}/retry",
                                  headers=alice["headers"])
        assert again.status_code == 200 and again.json()["delivery"]["status"] == "pending"
        (*_, fifth) = await received(hook, 5)
        assert fifth.headers["webhook-id"] == delivery["webhook_id"]


async def test_a_delivery_past_the_retry_window_fails(client, alice, template):
    made = await subscribe(client, alice, url="http://127.0.0.1:9/closed", events=["run.succeeded"])
    await WebhookDelivery._meta.database.aexecute(WebhookDelivery.delete())
    await run(client, alice, template)
    row = (await WebhookDelivery._meta.database.list(WebhookDelivery.select()))[0]
    await WebhookDelivery._meta.database.aexecute(WebhookDelivery.update(
        created_at=utcnow() - dt.timedelta(hours=24)).where(WebhookDelivery.id == row.id))
    client.app.ctx.process.deliveries.wake()
    for _ in range(200):
        deliveries = (await client.get(f"{API}/subscription/{made['subscription_id']}/deliveries",
                                       headers=alice["headers"])).json()["deliveries"]
        if deliveries[0]["status"] == "failed":
            break
        await asyncio.sleep(0.05)
    assert deliveries[0]["status"] == "failed" and deliveries[0]["next_attempt_at"] is None
    assert deliveries[0]["attempts"][-1]["response_code"] is None and deliveries[0]["attempts"][-1]["error"]


async def test_only_matching_events_and_templates(client, alice, worker, template):
    other = await make_template(client, alice, [{"id": "a", "agent": {"worker": worker}, "prompt": "x"}], name="o")
    await subscribe(client, alice, url="http://127.0.0.1:9/a", events=["run.failed"])
    await subscribe(client, alice, url="http://127.0.0.1:9/b", events=["run.succeeded"], template_id=other)
    await run(client, alice, template)
    assert await WebhookDelivery._meta.database.count(WebhookDelivery.select()) == 0
    await run(client, alice, other)
    assert await WebhookDelivery._meta.database.count(WebhookDelivery.select()) == 1


async def test_a_waiting_run_is_delivered_with_its_question(client, alice):
    asks = await make_template(client, alice, [{"id": "h", "agent": {"human": True}, "prompt": "Name?"}], name="h")
    with WebhookReceiver() as hook:
        made = await subscribe(client, alice, url=hook.url, events=["run.waiting_reply"])
        done = await run(client, alice, asks)
        assert done["status"] == "waiting_reply"
        (request,) = await received(hook, 1)
        payload = Webhook(made["secret"]).verify(request.body, request.headers)
        assert payload["type"] == "run.waiting_reply" and payload["status"] == "waiting_reply"
        assert payload["prompt"] == "Name?" and payload["request_id"] == done["pending_replies"][0]["request_id"]


@pytest.mark.parametrize("body, field", [
    ({"url": "http://10.1.2.3/hook", "events": ["run.failed"]}, "url"),
    ({"url": "ftp://example.com/x", "events": ["run.failed"]}, "url"),
    ({"url": "http://127.0.0.1/x", "events": ["run.started"]}, "events"),
    ({"url": "http://127.0.0.1/x", "events": []}, "events"),
    ({"url": "http://127.0.0.1/x", "events": ["run.failed"] * 5}, "events"),
    ({"url": "http://127.0.0.1/x", "events": ["run.failed"], "template_id": "00000000-0000-4000-8000-000000000000"},
     "template_id"),
])
async def test_refused_bodies(client, alice, body, field):
    refused = assert_error(await client.post(f"{API}/subscription", headers=alice["headers"], json=body),
                           422, "ValidationError")
    assert field in [p["field"].split(".")[0] for p in refused["detail"]], refused
    if field == "url" and "10.1.2.3" in body["url"]:
        assert refused["detail"][0]["setting"] == "ORCHESTRA_STEP_EGRESS_ALLOW"
    assert await EventSubscription._meta.database.count(EventSubscription.select()) == 0


async def test_others_see_nothing(client, alice, user):
    made = await subscribe(client, alice, url="http://127.0.0.1:9/x", events=["run.failed"])
    sid = made["subscription_id"]
    for method, path in (("get", sid), ("delete", sid), ("get", f"{sid}/deliveries"),
                         ("post", f"{sid}/deliveries/{sid}/retry")):
        answer = await getattr(client, method)(f"{API}/subscription/{path}", headers=user["headers"])
        assert_error(answer, 404, "NotFoundError")
    assert (await client.get(f"{API}/subscription", headers=user["headers"])).json()["subscriptions"] == []
    listed = (await client.get(f"{API}/subscription", headers=alice["headers"])).json()["subscriptions"]
    assert [s["subscription_id"] for s in listed] == [sid]
    assert (await client.delete(f"{API}/subscription/{sid}", headers=alice["headers"])).status_code == 200
    assert (await client.get(f"{API}/subscription", headers=alice["headers"])).json()["subscriptions"] == []


HUMAN = [{"id": "h", "agent": {"human": True}, "prompt": "Name?"}]


async def test_subscriptions_belong_to_a_workspace_and_hear_its_runs(client, alice, users):
    """A team workspace's subscription (editor there) is told of that workspace's runs,
    whoever starts them; a personal one of its owner's runs only. Members read it, editors
    delete it; a non-member gets 404; a template of another workspace is 422 (SPEC §16)."""
    bob, carol, dave, eve = [await users.make(n) for n in ("bob", "carol", "dave", "eve")]
    wid = (await client.post("/api/v1/workspace", headers=alice["headers"], json={"name": "team"})).json()["workspace_id"]
    for name, role in (("bob", "editor"), ("carol", "runner"), ("dave", "viewer")):
        added = await client.post(f"/api/v1/workspace/{wid}/member", headers=alice["headers"],
                                  json={"user_name": name, "role": role})
        assert added.status_code == 201, added.text
    made = await client.post(f"{API}/template", headers=bob["headers"],
                             json={"name": "ask", "steps": HUMAN, "workspace_id": wid})
    team_tid = made.json()["template_id"]
    own_tid = await make_template(client, bob, HUMAN, name="own")
    body = {"url": "http://127.0.0.1:9/hook", "events": ["run.waiting_reply"], "workspace_id": wid}
    refused = assert_error(await client.post(f"{API}/subscription", headers=carol["headers"], json=body),
                           403, "PermissionDeniedError")
    assert refused["detail"]["role_needed"] == "editor"
    assert_error(await client.post(f"{API}/subscription", headers=eve["headers"], json=body), 404, "NotFoundError")
    crossed = assert_error(await client.post(f"{API}/subscription", headers=bob["headers"],
                                             json={**body, "template_id": own_tid}), 422, "ValidationError")
    assert crossed["detail"][0]["field"] == "template_id"
    team_sub = (await subscribe(client, bob, **body, template_id=team_tid))["subscription"]
    assert team_sub["workspace_id"] == wid
    bobs_own = (await subscribe(client, bob, url=body["url"], events=body["events"]))["subscription"]
    assert bobs_own["workspace_id"] == await personal_id(client, bob)
    # the runner's run of the team template: the team's subscription hears it, bob's own does not
    done = await run(client, carol, team_tid)
    assert done["status"] == "waiting_reply"
    db = client.app.ctx.core.db
    for sid, count in ((team_sub["subscription_id"], 1), (bobs_own["subscription_id"], 0)):
        assert await db.count(WebhookDelivery.select().where(WebhookDelivery.subscription == sid)) == count
    # bob's own run is heard by his own subscription
    assert (await run(client, bob, own_tid))["status"] == "waiting_reply"
    assert await db.count(WebhookDelivery.select().where(
        WebhookDelivery.subscription == bobs_own["subscription_id"])) == 1
    # members read it, non-members do not; editors delete it
    sid = team_sub["subscription_id"]
    listed = (await client.get(f"{API}/subscription", headers=dave["headers"])).json()["subscriptions"]
    assert [s["subscription_id"] for s in listed] == [sid]
    only = (await client.get(f"{API}/subscription", params={"workspace_id": wid},
                             headers=bob["headers"])).json()["subscriptions"]
    assert [s["subscription_id"] for s in only] == [sid]
    assert (await client.get(f"{API}/subscription/{sid}/deliveries", headers=dave["headers"])).status_code == 200
    assert_error(await client.get(f"{API}/subscription/{sid}", headers=eve["headers"]), 404, "NotFoundError")
    assert_error(await client.get(f"{API}/subscription", params={"workspace_id": wid}, headers=eve["headers"]),
                 404, "NotFoundError")
    assert_error(await client.delete(f"{API}/subscription/{sid}", headers=dave["headers"]), 403, "PermissionDeniedError")
    assert (await client.delete(f"{API}/subscription/{sid}", headers=alice["headers"])).status_code == 200
    assert_error(await client.get(f"{API}/subscription/{sid}", headers=bob["headers"]), 404, "NotFoundError")
