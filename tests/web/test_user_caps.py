"""Caps per user and pacing (SPEC §15b), in process, on both stores, with real loopback
receivers: a user's schedules and subscriptions are capped by a setting each (422 naming
it; other users unaffected); deliveries to one destination host are paced; an inbound
hook's rate limit counts verified calls only, while calls that do not verify are limited
per client address."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.db.models import WorkflowRun
from orchestra.db.trigger_models import EventSubscription, WorkflowSchedule
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.web.test_hooks import make_hook, path, signed
from tests.web.test_hooks import template as human_template

WF = "/api/v1/workflow"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
def settings_overrides():
    return {"max_schedules_per_user": 3, "max_subscriptions_per_user": 3, "delivery_host_rate": 10,
            "step_egress_allow": "127.0.0.1",
            "rate_limit_hook": "5/minute", "rate_limit_hook_unverified": "4/minute"}


def assert_cap(response, setting: str, field: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "ValidationError" and setting in body["message"], body
    assert body["detail"] == [{"field": field, "problem": body["detail"][0]["problem"], "setting": setting}]


async def test_schedules_and_subscriptions_are_capped_per_user(client, users):
    alice, bob = await users.make("alice"), await users.make("bob")
    tid = await human_template(client, alice)
    bob_tid = await human_template(client, bob)
    schedule = {"template_id": tid, "cron": "0 9 * * *"}
    for _ in range(3):
        made = await client.post(f"{WF}/schedule", headers=alice["headers"], json=schedule)
        assert made.status_code == 201, made.text
        made = await client.post(f"{WF}/subscription", headers=alice["headers"],
                                 json={"url": "http://127.0.0.1:9/x", "events": ["run.failed"]})
        assert made.status_code == 201, made.text
    assert_cap(await client.post(f"{WF}/schedule", headers=alice["headers"], json=schedule),
               "ORCHESTRA_MAX_SCHEDULES_PER_USER", "template_id")
    assert_cap(await client.post(f"{WF}/subscription", headers=alice["headers"],
                                 json={"url": "http://127.0.0.1:9/x", "events": ["run.failed"]}),
               "ORCHESTRA_MAX_SUBSCRIPTIONS_PER_USER", "url")
    db = client.app.ctx.core.db
    assert await db.count(WorkflowSchedule.select()) == 3 and await db.count(EventSubscription.select()) == 3
    # another user is not affected, and a deleted one makes room
    assert (await client.post(f"{WF}/schedule", headers=bob["headers"],
                              json={**schedule, "template_id": bob_tid})).status_code == 201
    listed = (await client.get(f"{WF}/schedule", headers=alice["headers"])).json()["schedules"]
    assert (await client.delete(f"{WF}/schedule/{listed[0]['schedule_id']}", headers=alice["headers"])).status_code == 200
    assert (await client.post(f"{WF}/schedule", headers=alice["headers"], json=schedule)).status_code == 201


@pytest.mark.parametrize("settings_overrides", [{"delivery_host_rate": 10, "step_egress_allow": "127.0.0.1"}])
async def test_deliveries_to_one_host_are_paced(client, users):
    """25 subscriptions to one host: 25 signed POSTs for one run, spread at 10 a second
    instead of one burst."""
    alice = await users.make("alice")
    tid = await human_template(client, alice)
    with WebhookReceiver() as receiver:
        for _ in range(25):
            made = await client.post(f"{WF}/subscription", headers=alice["headers"],
                                     json={"url": receiver.url, "events": ["run.waiting_reply"]})
            assert made.status_code == 201, made.text
        started = await client.post(f"{WF}/run", headers=alice["headers"], json={"template_id": tid, "input": "x"})
        assert started.status_code == 202
        got = await asyncio.to_thread(receiver.wait_for, 25, 15.0)
        assert len(got) == 25, len(got)
        times = sorted(r.at for r in got)
        assert times[-1] - times[0] >= 2.0, f"25 deliveries within {times[-1] - times[0]:.2f} s"
        most_in_a_second = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
        assert most_in_a_second <= 13, most_in_a_second  # 10 a second, give or take a loaded machine
        assert len({r.headers["webhook-id"] for r in got}) == 25  # each once: none dropped or doubled
    await client.post(f"{WF}/cancel/{started.json()['trace_id']}", headers=alice["headers"])


async def test_unverified_calls_cannot_use_up_a_hooks_limit(client, users):
    alice = await users.make("alice")
    made = await make_hook(client, alice, await human_template(client, alice))
    body = b"{}"
    forged = {**signed("whsec_" + "A" * 32, body), "content-type": "application/json"}
    codes = [(await client.post(path(made), content=body)).status_code for _ in range(2)]
    codes += [(await client.post(path(made), content=body, headers=forged)).status_code for _ in range(2)]
    assert codes == [401, 401, 401, 401]
    flooded = await client.post(path(made), content=body, headers=forged)
    assert flooded.status_code == 429 and "ORCHESTRA_RATE_LIMIT_HOOK_UNVERIFIED" in flooded.json()["message"]
    # the hook's own limit is untouched: its sender's five verified calls all start runs
    verified = [(await client.post(path(made), content=body, headers=signed(made["secret"], body))).status_code
                for _ in range(6)]
    assert verified == [202] * 5 + [429]
    assert await client.app.ctx.core.db.count(WorkflowRun.select()) == 5
