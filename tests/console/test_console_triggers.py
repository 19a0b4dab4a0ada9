"""The console's Schedules and Subscriptions pages in Chromium, against a real server:
a schedule added in the form shows its next fires in its zone's offset and, once it
fired, its last outcome; a subscription shows its secret once and its deliveries with
their response codes (a real receiving server on loopback)."""

from __future__ import annotations

import datetime as dt

import httpx
from playwright.sync_api import expect

from tests.console.conftest import PASSWORD, Console
from tests.fakes.webhook_receiver import WebhookReceiver


def api(served) -> httpx.Client:
    token = httpx.post(f"{served.base_url}/api/v1/auth/login",
                       json={"user_name": "root", "password": PASSWORD}).json()["access_token"]
    return httpx.Client(base_url=served.base_url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                        timeout=30)


def test_schedules_and_subscriptions_pages(chromium, served, screenshots, fake):
    http = api(served)
    provider = http.post("/provider", json={"name": "p", "provider": "openai_compatible", "model_id": "m",
                                            "api_key": "k", "base_url": fake.base_url}).json()["provider_id"]
    worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider, "tools": []}).json()["worker_id"]
    made = http.post("/workflow/template", json={"name": "nightly", "steps": [
        {"id": "a", "agent": {"worker": worker}, "prompt": "report {{input}}"}]})
    assert made.status_code == 201, made.text
    console = Console(chromium, served, screenshots)
    page = console.page
    with WebhookReceiver(statuses=[500]) as hook:
        try:
            console.sign_in("root")
            page.get_by_role("link", name="Schedules").click()
            page.get_by_role("heading", name="Schedules", exact=True).wait_for()
            page.get_by_text("No schedules yet").wait_for()
            page.get_by_label("Cron").fill("0 0 30 2 *")
            page.get_by_label("Time zone").fill("America/New_York")
            page.get_by_role("button", name="Add schedule").click()
            page.get_by_role("alert").filter(has_text="cron").wait_for()
            page.get_by_label("Cron").fill("30 6 * * *")
            page.get_by_role("button", name="Add schedule").click()
            page.get_by_text("Schedule added").wait_for()
            (schedule,) = http.get("/workflow/schedule").json()["schedules"]
            row = page.locator(f'tr[data-schedule="{schedule["schedule_id"]}"]')
            expect(row).to_contain_text(schedule["next_fires"][0])
            offset = dt.datetime.fromisoformat(schedule["next_fires"][0]).utcoffset()
            assert offset in (dt.timedelta(hours=-5), dt.timedelta(hours=-4))
            row.get_by_role("button", name="Disable").click()
            expect(row).to_contain_text("disabled")
            console.shot("schedules")

            page.get_by_role("link", name="Subscriptions").click()
            page.get_by_role("heading", name="Subscriptions", exact=True).wait_for()
            page.get_by_label("URL").fill(hook.url)
            page.get_by_role("button", name="Add subscription").click()
            secret = page.locator("p.secret code").inner_text()
            assert secret.startswith("whsec_")
            run = http.post("/workflow/run", json={"template_id": made.json()["template_id"], "input": "x"})
            assert run.status_code == 202
            hook.wait_for(1, timeout=20)
            page.get_by_role("button", name="Done").click()
            assert secret not in page.content()
            page.get_by_text("Deliveries", exact=True).click()
            page.get_by_role("button", name="Refresh").click()
            page.locator("td.codes").get_by_text("500").wait_for()
            console.shot("subscriptions")
            assert console.errors == [], console.errors
        finally:
            console.close()
