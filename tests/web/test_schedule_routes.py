"""`/api/v1/workflow/schedule` in process, on both stores: statuses, bodies, what is
stored, and fires (the app's own fire loop, woken after a due time is moved into the past)."""

from __future__ import annotations

import asyncio
import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from orchestra.db.models import WorkflowRun, utcnow
from orchestra.db.trigger_models import ScheduleFire, WorkflowSchedule

API = "/api/v1/workflow"


@pytest.fixture
def database_url(both_stores):
    return both_stores


@pytest.fixture
async def worker(alice, make_worker):
    return await make_worker(alice, [])


async def make_template(client, who, steps, name="t", **extra):
    response = await client.post(f"{API}/template", headers=who["headers"],
                                 json={"name": name, "steps": steps, **extra})
    assert response.status_code == 201, response.text
    return response.json()["template_id"]


@pytest.fixture
async def template(client, alice, worker):
    return await make_template(client, alice, [{"id": "a", "agent": {"worker": worker}, "prompt": "Do {{input}}"}])


@pytest.fixture
async def waiting_template(client, alice):
    """A template whose runs wait for a person (they stay active)."""
    return await make_template(client, alice, [{"id": "h", "agent": {"human": True}, "prompt": "Name?"}],
                               name="waits")


@pytest.fixture
async def loop(client):
    """The app's fire loop, stopped: the test fires by hand at the times it chooses."""
    fire_loop = client.app.ctx.process.fires
    await fire_loop.stop()
    return fire_loop


def assert_error(response, status: int, error: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and body["message"]
    return body


async def create(client, who, **body):
    response = await client.post(f"{API}/schedule", headers=who["headers"], json=body)
    assert response.status_code == 201, response.text
    return response.json()


async def make_due(client, schedule_id: str, ago: dt.timedelta) -> dt.datetime:
    """Move the schedule's next due time `ago` into the past (a due time of its cron)."""
    row = await WorkflowSchedule.aget(WorkflowSchedule.id == schedule_id)
    due = (utcnow() - ago).replace(second=0, microsecond=0)
    await client.app.ctx.core.db.aexecute(
        WorkflowSchedule.update(next_due_at=due).where(WorkflowSchedule.id == row.id))
    return due


async def fires_of(schedule_id: str, count: int, timeout: float = 10.0) -> list[ScheduleFire]:
    for _ in range(int(timeout / 0.05)):
        rows = await ScheduleFire._meta.database.list(
            ScheduleFire.select().where(ScheduleFire.schedule == schedule_id).order_by(ScheduleFire.due_at))
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(rows)} fire(s), expected {count}")


async def test_create_read_list_update_delete(client, alice, template):
    made = await create(client, alice, template_id=template, cron="0 9 * * 1-5",
                        timezone="America/New_York", input="report")
    assert made["message"] == "success"
    view = made["schedule"]
    sid = made["schedule_id"]
    assert view["schedule_id"] == sid and view["template_id"] == template
    assert view["overlap"] == "skip" and view["catchup"] == "latest"
    assert view["catchup_window_seconds"] == 3600 and view["enabled"] is True
    assert view["last_fire"] is None and view["input"] == "report"
    assert len(view["next_fires"]) == 5
    zone = ZoneInfo("America/New_York")
    for text in view["next_fires"]:
        moment = dt.datetime.fromisoformat(text)
        assert moment.utcoffset() == moment.astimezone(zone).utcoffset()
        local = moment.astimezone(zone)
        assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
    assert view["next_fires"] == sorted(view["next_fires"], key=dt.datetime.fromisoformat)
    got = (await client.get(f"{API}/schedule/{sid}", headers=alice["headers"])).json()
    assert got["schedule"] == view
    listed = (await client.get(f"{API}/schedule", headers=alice["headers"])).json()
    assert [s["schedule_id"] for s in listed["schedules"]] == [sid] and listed["next_cursor"] is None
    put = await client.put(f"{API}/schedule/{sid}", headers=alice["headers"],
                           json={"template_id": template, "cron": "*/10 * * * *", "enabled": False})
    assert put.status_code == 200, put.text
    assert put.json()["schedule"]["enabled"] is False and put.json()["schedule"]["next_fires"] == []
    stored = await WorkflowSchedule.aget(WorkflowSchedule.id == sid)
    assert stored.next_due_at is None and stored.cron == "*/10 * * * *" and stored.timezone == "UTC"
    gone = await client.delete(f"{API}/schedule/{sid}", headers=alice["headers"])
    assert gone.status_code == 200 and gone.json() == {"message": "success"}
    assert_error(await client.get(f"{API}/schedule/{sid}", headers=alice["headers"]), 404, "NotFoundError")


@pytest.mark.parametrize("changes, field", [
    ({"cron": "0 0 30 2 *"}, "cron"),
    ({"cron": "0 0 * * * *"}, "cron"),
    ({"cron": "61 * * * *"}, "cron"),
    ({"timezone": "Mars/Olympus"}, "timezone"),
    ({"template_id": "00000000-0000-4000-8000-000000000000"}, "template_id"),
    ({"overlap": "sometimes"}, "overlap"),
    ({"catchup": "most"}, "catchup"),
    ({"catchup_window_seconds": -1}, "catchup_window_seconds"),
])
async def test_refused_bodies_name_the_field_and_store_nothing(client, alice, template, changes, field):
    body = {"template_id": template, "cron": "* * * * *", **changes}
    refused = assert_error(await client.post(f"{API}/schedule", headers=alice["headers"], json=body),
                           422, "ValidationError")
    assert field in [p["field"] for p in refused["detail"]], refused
    assert await WorkflowSchedule._meta.database.count(WorkflowSchedule.select()) == 0


async def test_a_template_the_owner_may_not_run_is_422(client, alice, user, template):
    refused = assert_error(await client.post(f"{API}/schedule", headers=user["headers"],
                                             json={"template_id": template, "cron": "* * * * *"}),
                           422, "ValidationError")
    assert [p["field"] for p in refused["detail"]] == ["template_id"]
    made = await create(client, alice, template_id=template, cron="* * * * *")
    assert_error(await client.get(f"{API}/schedule/{made['schedule_id']}", headers=user["headers"]),
                 404, "NotFoundError")
    assert_error(await client.delete(f"{API}/schedule/{made['schedule_id']}", headers=user["headers"]),
                 404, "NotFoundError")


async def test_a_due_time_fires_once_as_the_owner_with_its_trigger(client, alice, template, loop):
    made = await create(client, alice, template_id=template, cron="* * * * *", input="x")
    sid = made["schedule_id"]
    due = await make_due(client, sid, dt.timedelta(minutes=2))
    # Many looks at once (as from many processes), 5 s after the due time: one fire.
    await asyncio.gather(*(loop.fire_due(now=due + dt.timedelta(seconds=5)) for _ in range(4)))
    fires = await fires_of(sid, 1)
    assert len(fires) == 1 and fires[0].outcome == "started" and fires[0].due_at == due
    run = await WorkflowRun.aget(WorkflowRun.trace_id == fires[0].trace_id)
    assert run.owner_id == alice["user_id"] and run.input == "x"
    assert run.trigger == {"kind": "schedule", "schedule_id": sid, "due_at": due.isoformat() + "+00:00"}
    schedule = await WorkflowSchedule.aget(WorkflowSchedule.id == sid)
    assert schedule.next_due_at == due + dt.timedelta(minutes=1)
    view = (await client.get(f"{API}/schedule/{sid}", headers=alice["headers"])).json()["schedule"]
    assert view["last_fire"] == {"due_at": due.isoformat() + "+00:00", "trace_id": run.trace_id,
                                 "outcome": "started"}
    detail = (await client.get(f"{API}/run/{run.trace_id}", headers=alice["headers"])).json()
    assert detail["trigger"] == run.trigger
    assert await ScheduleFire._meta.database.count(ScheduleFire.select()) == 1


@pytest.mark.parametrize("catchup, started, missed", [("all", 6, 0), ("latest", 2, 4), ("none", 1, 5)])
async def test_catchup_of_missed_due_times(client, alice, template, catchup, started, missed, loop):
    made = await create(client, alice, template_id=template, cron="* * * * *", overlap="allow",
                        catchup=catchup)
    sid = made["schedule_id"]
    # Six due times, the oldest five more than a minute late (missed), the newest on time.
    due = await make_due(client, made["schedule_id"], dt.timedelta(minutes=5, seconds=1))
    await loop.fire_due(now=due + dt.timedelta(minutes=5, seconds=1))
    fires = await fires_of(sid, 6)
    outcomes = [f.outcome for f in fires]
    assert [f.due_at for f in fires] == [due + dt.timedelta(minutes=i) for i in range(6)]
    assert outcomes.count("started") == started and outcomes.count("missed") == missed
    assert outcomes[-1] == "started"  # the on-time one always
    runs = await WorkflowRun._meta.database.count(WorkflowRun.select().where(WorkflowRun.trigger.is_null(False)))
    assert runs == started


async def test_overlap_skip_and_cancel_previous(client, alice, waiting_template, loop):
    skip = await create(client, alice, template_id=waiting_template, cron="* * * * *", overlap="skip")
    due = await make_due(client, skip["schedule_id"], dt.timedelta(minutes=1, seconds=1))
    await loop.fire_due(now=due + dt.timedelta(seconds=1))
    first = (await fires_of(skip["schedule_id"], 1))[0]
    assert first.outcome == "started"
    await loop.fire_due(now=due + dt.timedelta(minutes=1, seconds=1))
    second = (await fires_of(skip["schedule_id"], 2))[1]
    assert second.outcome == "skipped" and second.trace_id is None and first.trace_id in second.error

    cancel = await create(client, alice, template_id=waiting_template, cron="* * * * *",
                          overlap="cancel_previous")
    await client.delete(f"{API}/schedule/{skip['schedule_id']}", headers=alice["headers"])
    due = await make_due(client, cancel["schedule_id"], dt.timedelta(minutes=1, seconds=1))
    await loop.fire_due(now=due + dt.timedelta(seconds=1))
    earlier = (await fires_of(cancel["schedule_id"], 1))[0]
    await loop.fire_due(now=due + dt.timedelta(minutes=1, seconds=1))
    later = (await fires_of(cancel["schedule_id"], 2))[1]
    assert later.outcome == "started"
    for _ in range(200):
        run = await WorkflowRun.aget(WorkflowRun.trace_id == earlier.trace_id)
        if run.status == "cancelled":
            break
        await asyncio.sleep(0.05)
    assert run.status == "cancelled"
    assert (await WorkflowRun.aget(WorkflowRun.trace_id == later.trace_id)).status != "cancelled"


async def test_the_loop_fires_by_itself(client, alice, template):
    made = await create(client, alice, template_id=template, cron="* * * * *")
    await make_due(client, made["schedule_id"], dt.timedelta(seconds=1))
    client.app.ctx.process.fires.wake()
    fire = (await fires_of(made["schedule_id"], 1))[0]
    assert fire.outcome == "started"


async def test_a_schedule_that_cannot_fire_holds_up_no_other(client, alice, template, loop):
    broken = await create(client, alice, template_id=template, cron="* * * * *")
    fine = await create(client, alice, template_id=template, cron="* * * * *")
    # A zone this server's database no longer knows (stored by an older one).
    await client.app.ctx.core.db.aexecute(WorkflowSchedule.update(timezone="Mars/Olympus").where(
        WorkflowSchedule.id == broken["schedule_id"]))
    due = await make_due(client, broken["schedule_id"], dt.timedelta(minutes=2))
    await make_due(client, fine["schedule_id"], dt.timedelta(minutes=2))
    for _ in range(3):
        await loop.fire_due(now=due + dt.timedelta(seconds=5))
    (fire,) = await fires_of(fine["schedule_id"], 1)
    assert fire.outcome == "started"
    assert await ScheduleFire._meta.database.count(
        ScheduleFire.select().where(ScheduleFire.schedule == broken["schedule_id"])) == 0
    stored = await WorkflowSchedule.aget(WorkflowSchedule.id == broken["schedule_id"])
    assert stored.next_due_at == due  # still due: made up once it can fire
    shown = await client.get(f"{API}/schedule/{broken['schedule_id']}", headers=alice["headers"])
    assert shown.status_code == 200, shown.text


async def test_retention_prunes_old_fire_records_and_ended_deliveries(client, alice, template, loop):
    from orchestra.db.trigger_models import EventSubscription, WebhookDelivery
    from orchestra.services import retention

    made = await create(client, alice, template_id=template, cron="* * * * *", overlap="allow", catchup="all")
    due = await make_due(client, made["schedule_id"], dt.timedelta(minutes=3))
    await loop.fire_due(now=due + dt.timedelta(minutes=3, seconds=1))
    assert len(await fires_of(made["schedule_id"], 4)) == 4
    sub = await EventSubscription.acreate(owner=alice["user_id"], url="http://127.0.0.1:9/x", events=["run.failed"],
                                          secret_encrypted="x")
    for status in ("pending", "delivered", "failed"):
        await WebhookDelivery.acreate(subscription=sub.id, event="run.failed", trace_id="t", payload="{}",
                                      status=status, created_at=due)
    core = client.app.ctx.core
    # Keep 1.5 minutes: the two oldest due times and the ended deliveries go.
    await retention.prune(core, older_than=dt.timedelta(minutes=1, seconds=30),
                          now=due + dt.timedelta(minutes=3, seconds=1))
    left = await fires_of(made["schedule_id"], 2)
    assert [f.due_at for f in left] == [due + dt.timedelta(minutes=2), due + dt.timedelta(minutes=3)]
    statuses = [d.status for d in await core.db.list(WebhookDelivery.select())]
    assert statuses == ["pending"]


async def test_fire_history_pages_newest_first_with_outcomes_and_runs(client, alice, user, template, loop):
    made = await create(client, alice, template_id=template, cron="* * * * *", timezone="Asia/Kolkata",
                        overlap="allow", catchup="none")
    sid = made["schedule_id"]
    # Four due times, the oldest three missed (more than a minute late), the newest on time.
    due = await make_due(client, sid, dt.timedelta(minutes=3, seconds=1))
    await loop.fire_due(now=due + dt.timedelta(minutes=3, seconds=1))
    stored = await fires_of(sid, 4)
    started = next(f for f in stored if f.outcome == "started")
    for _ in range(200):  # its run ends (whatever its step does): its status then stays
        run = await WorkflowRun.aget(WorkflowRun.trace_id == started.trace_id)
        if run.finished_at is not None:
            break
        await asyncio.sleep(0.05)
    assert run.finished_at is not None
    url = f"{API}/schedule/{sid}/fires"
    first = await client.get(url, headers=alice["headers"], params={"limit": 3})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["schedule_id"] == sid and body["timezone"] == "Asia/Kolkata" and body["next_cursor"]
    zone = ZoneInfo("Asia/Kolkata")
    expected = [due + dt.timedelta(minutes=i) for i in (3, 2, 1, 0)]
    assert [dt.datetime.fromisoformat(f["due_at"]) for f in body["fires"]] == [
        d.replace(tzinfo=dt.UTC).astimezone(zone) for d in expected[:3]]
    assert all(f["due_at"].endswith("+05:30") and f["fired_at"].endswith("+05:30") for f in body["fires"])
    newest, *older = body["fires"]
    assert newest["outcome"] == "started" and newest["trace_id"] == started.trace_id
    assert newest["run_status"] == run.status and newest["error"] is None
    assert [f["outcome"] for f in older] == ["missed", "missed"]
    assert all(f["trace_id"] is None and f["run_status"] is None and "catchup" in f["error"] for f in older)
    second = (await client.get(url, headers=alice["headers"],
                               params={"limit": 3, "cursor": body["next_cursor"]})).json()
    assert [dt.datetime.fromisoformat(f["due_at"]) for f in second["fires"]] == [
        expected[3].replace(tzinfo=dt.UTC)]
    assert second["fires"][0]["outcome"] == "missed" and second["next_cursor"] is None
    assert (await client.get(url, headers=alice["headers"])).json()["fires"] == body["fires"] + second["fires"]
    # someone else's schedule is not found; a cursor of another list is refused at `cursor`
    assert_error(await client.get(url, headers=user["headers"]), 404, "NotFoundError")
    refused = assert_error(await client.get(url, headers=alice["headers"], params={"cursor": "run.1.x"}),
                           422, "ValidationError")
    assert refused["detail"][0]["field"] == "cursor"
    assert_error(await client.get(url, headers=alice["headers"], params={"limit": 0}), 422, "ValidationError")
