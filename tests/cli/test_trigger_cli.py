"""`orchestra schedule …` and `orchestra subscription …` through a real server, checked
against what the API then holds; the subscription's secret is printed once (SPEC §5, §11)."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.cli_harness import api_world, one_error_line

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


def test_schedule_add_list_show_update_disable_remove(world):
    cli, api = world["cli"], world["api"]
    template = world["templates"]["three_step"]["template_id"]
    done = cli("schedule", "add", template, "30 8 * * 1-5", "--tz", "Europe/Paris", "--input", "daily")
    assert done.returncode == 0, done.stderr
    schedule_id = done.stdout.strip()
    stored = api.get(f"/workflow/schedule/{schedule_id}").json()["schedule"]
    assert stored["cron"] == "30 8 * * 1-5" and stored["timezone"] == "Europe/Paris" and stored["input"] == "daily"
    assert "next:" in done.stderr and stored["next_fires"][0] in done.stderr
    listed = json.loads(cli("schedule", "list", "--json").stdout)
    assert [s["schedule_id"] for s in listed] == [schedule_id]
    table = cli("schedule", "list")
    assert table.returncode == 0 and "Europe/Paris" in table.stdout and schedule_id in table.stdout
    shown = json.loads(cli("schedule", "show", schedule_id, "--json").stdout)
    assert shown == api.get(f"/workflow/schedule/{schedule_id}").json()["schedule"]
    updated = cli("schedule", "update", schedule_id, "--cron", "0 7 * * *", "--overlap", "allow", "--json")
    assert updated.returncode == 0, updated.stderr
    after = api.get(f"/workflow/schedule/{schedule_id}").json()["schedule"]
    assert after["cron"] == "0 7 * * *" and after["overlap"] == "allow" and after["input"] == "daily"
    assert cli("schedule", "disable", schedule_id).returncode == 0
    assert api.get(f"/workflow/schedule/{schedule_id}").json()["schedule"]["enabled"] is False
    assert cli("schedule", "enable", schedule_id).returncode == 0
    assert api.get(f"/workflow/schedule/{schedule_id}").json()["schedule"]["enabled"] is True
    refused = cli("schedule", "add", template, "0 0 30 2 *")
    assert refused.returncode != 0 and "cron" in one_error_line(refused)
    assert cli("schedule", "remove", schedule_id, "--yes").returncode == 0
    assert api.get(f"/workflow/schedule/{schedule_id}").status_code == 404


def test_subscription_secret_is_shown_once(world):
    cli, api = world["cli"], world["api"]
    done = cli("subscription", "add", "http://127.0.0.1:9/hook", "--event", "run.failed")
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert secret.startswith("whsec_") and "\n" not in secret
    (sub,) = api.get("/workflow/subscription").json()["subscriptions"]
    assert sub["events"] == ["run.failed"] and sub["subscription_id"] in done.stderr
    for args in (("subscription", "list"), ("subscription", "list", "--json"),
                 ("subscription", "deliveries", sub["subscription_id"])):
        shown = cli(*args)
        assert shown.returncode == 0, shown.stderr
        assert secret not in shown.stdout and secret not in shown.stderr
    assert "127.0.0.1:9/hook" in cli("subscription", "list").stdout
    assert json.loads(cli("subscription", "deliveries", sub["subscription_id"], "--json").stdout) == []
    assert cli("subscription", "remove", sub["subscription_id"], "--yes").returncode == 0
    assert api.get("/workflow/subscription").json()["subscriptions"] == []


def test_deliveries_show_why_an_attempt_had_no_answer(world):
    """The attempts column says the error when no response came, not just a dash."""
    cli, api = world["cli"], world["api"]
    done = cli("subscription", "add", "http://127.0.0.1:9/hook", "--event", "run.succeeded")
    assert done.returncode == 0, done.stderr
    (sub,) = [s for s in api.get("/workflow/subscription").json()["subscriptions"]
              if s["events"] == ["run.succeeded"]]
    started = api.post("/workflow/run", json={
        "template_id": world["templates"]["three_step"]["template_id"], "input": "x"})
    assert started.status_code in (200, 201, 202), started.text
    deadline = time.monotonic() + 30
    while True:
        rows = api.get(f"/workflow/subscription/{sub['subscription_id']}/deliveries").json()["deliveries"]
        if rows and rows[0]["attempts"]:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.1)
    attempt = rows[0]["attempts"][0]
    assert attempt["response_code"] is None and attempt["error"], attempt
    shown = cli("subscription", "deliveries", sub["subscription_id"], env={"COLUMNS": "400"})
    assert shown.returncode == 0, shown.stderr
    assert f"1. {attempt['error']}" in shown.stdout, shown.stdout
    assert cli("subscription", "remove", sub["subscription_id"], "--yes").returncode == 0
