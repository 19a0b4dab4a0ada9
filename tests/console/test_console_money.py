"""The console's money views (SPEC §12), in a real browser against a real server: a run
paused by its budget offers a top-up that resumes it, steps and runs show their cost,
and the usage page charts cost by day and by template."""

from __future__ import annotations

import time

from playwright.sync_api import expect

from tests.console.conftest import Console
from tests.console.test_console_second_pass import api


def test_a_paused_run_is_topped_up_in_the_console_and_its_costs_are_shown(console: Console, fake):
    http = api(console)
    provider = http.post("/provider", json={
        "name": "priced", "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
        "base_url": fake.base_url, "prices": {"input_per_mtok": 100, "output_per_mtok": 200}})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider.json()["provider_id"]})
    # each call reserves ~$0.829 (4096 answer tokens at $200/M) and costs well under a cent:
    # a budget of $0.8281 pays for the first step only (its reservation: ~87 prompt tokens + 4096)
    made = http.post("/workflow/template", json={
        "name": "two", "limits": {"budget_usd": "0.8281", "on_budget": "pause"},
        "steps": [{"id": "a", "agent": {"worker": worker.json()["worker_id"]}, "prompt": "first {{input}}"},
                  {"id": "b", "agent": {"worker": worker.json()["worker_id"]}, "prompt": "second",
                   "depends_on": ["a"]}]})
    assert made.status_code == 201, made.text
    trace_id = http.post("/workflow/run", json={"template_id": made.json()["template_id"],
                                                "input": "x"}).json()["trace_id"]
    for _ in range(200):
        if http.get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_budget":
            break
        time.sleep(0.05)
    paused = http.get(f"/workflow/run/{trace_id}").json()
    assert paused["status"] == "waiting_budget", (paused["status"], paused["error"], paused["cost_usd"])
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    page = console.page
    expect(page.get_by_role("button", name="Raise the budget")).to_be_visible()
    expect(page.locator('[data-step="a"] .usage')).to_contain_text("$")
    console.shot("money-paused")
    page.get_by_label("Add (USD)").fill("1")
    page.get_by_role("button", name="Raise the budget").click()
    expect(page.locator("#outcome")).to_have_text("Run succeeded", timeout=20_000)
    run = http.get(f"/workflow/run/{trace_id}").json()
    assert run["status"] == "succeeded" and run["budget_usd"] == "1.8281"
    expect(page.locator('[data-step="b"] .usage')).to_contain_text(f"${run['steps'][1]['cost_usd']}")
    console.open("runs")
    expect(page.locator('td[data-label="Cost"]').first).to_contain_text(f"${run['cost_usd']}")
    console.open("usage")
    expect(page.get_by_role("img", name="By day")).to_be_visible()
    expect(page.get_by_role("img", name="By template")).to_contain_text("two")
    expect(page.locator('td[data-label="Cost"]').first).to_contain_text(f"${run['cost_usd']}")
    console.shot("money-usage")
    assert console.errors == []
