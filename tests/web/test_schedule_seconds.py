"""ORCHESTRA_CRON_SECONDS: a schedule's cron may lead with a seconds field (tests and
demonstrations); without the setting the same body is 422 (tests/web/test_schedule_routes.py
has the five-field contract)."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.web.test_schedule_routes import API, make_template


@pytest.fixture
def settings_overrides() -> dict:
    return {"cron_seconds": True}


async def test_a_six_field_cron_fires_every_twenty_seconds(client, alice):
    template = await make_template(client, alice, [{"id": "h", "agent": {"human": True}, "prompt": "?"}])
    made = await client.post(f"{API}/schedule", headers=alice["headers"],
                             json={"template_id": template, "cron": "*/20  * * * * *"})
    assert made.status_code == 201, made.text
    schedule = made.json()["schedule"]
    assert schedule["cron"] == "*/20 * * * * *"
    fires = [dt.datetime.fromisoformat(t) for t in schedule["next_fires"]]
    assert {t.second for t in fires} <= {0, 20, 40}
    assert [(b - a).total_seconds() for a, b in zip(fires, fires[1:], strict=False)] == [20.0] * (len(fires) - 1)
    seven = await client.post(f"{API}/schedule", headers=alice["headers"],
                              json={"template_id": template, "cron": "0 */20 * * * * *"})
    assert seven.status_code == 422 and seven.json()["detail"][0]["field"] == "cron"
