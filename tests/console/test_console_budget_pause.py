"""A budgeted parallel map paused and topped up in the console (issue 39 point 4, SPEC
§15b), in Chromium against a real server: the paused run's card says what it spent, of
what, and what the next call may cost; no item says `running` while no server holds the
run; after "Raise the budget" the header shows the new budget and the resume is a
top-up's (not "taken over after its server stopped"), and no step is shown as run twice."""

from __future__ import annotations

import time
from decimal import ROUND_CEILING, Decimal

import pytest

from orchestra.money.amounts import usd_text
from tests.conftest import ServerProcess
from tests.console.conftest import PASSWORD, Console
from tests.console.test_console_second_pass import api

expect = pytest.importorskip(
    "playwright.sync_api", reason="browser tests need Playwright for Python: pip install -e '.[test]'"
).expect


@pytest.fixture
def served(tmp_path):
    """The console's server, given longer to start on a busy machine."""
    server = ServerProcess(tmp_path / "home").start(timeout=90)
    made = server.cli("user", "create", "root", "--role", "SUPER_ADMINISTRATOR", "--password-stdin",
                      input=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr
    yield server
    server.stop()


def paused(http, trace_id: str, count: int) -> dict:
    for _ in range(400):
        run = http.get(f"/workflow/run/{trace_id}").json()
        pauses = [e for e in http.get(f"/workflow/run/{trace_id}/events").json()["events"]
                  if e["kind"] == "budget_exhausted"]
        if run["status"] != "queued" and run["status"] != "running" and len(pauses) >= count:
            return run
        time.sleep(0.05)
    raise AssertionError(f"not paused {count} times: {run['status']}")


def test_a_paused_map_shows_its_spend_and_a_top_up_goes_on_as_a_top_up(console: Console, fake):
    http = api(console)
    provider = http.post("/provider", json={
        "name": "priced", "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
        "base_url": fake.base_url, "prices": {"input_per_mtok": 100, "output_per_mtok": 200}})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "w", "provider_id": provider.json()["provider_id"]})
    # a call reserves ~$0.828 (4096 answer tokens at $200/M and its prompt's bound) and
    # costs ~$0.001: $0.83 pays for a few items, then the next one waits for a top-up
    made = http.post("/workflow/template", json={
        "name": "map", "input_schema": {"type": "array"}, "limits": {"budget_usd": "0.83", "on_budget": "pause"},
        "steps": [{"id": "m", "foreach": {"items": "input", "max_concurrency": 2},
                   "agent": {"worker": worker.json()["worker_id"]}, "prompt": "item {{index}}: {{item}}"}]})
    assert made.status_code == 201, made.text
    trace_id = http.post("/workflow/run", json={"template_id": made.json()["template_id"],
                                                "input": [f"t{n}" for n in range(12)]}).json()["trace_id"]
    run = paused(http, trace_id, 1)
    assert run["status"] == "waiting_budget", (run["status"], run["error"])
    done = len([s for s in run["steps"] if s["path"].startswith("m[") and s["status"] == "succeeded"])
    exhausted = [e for e in http.get(f"/workflow/run/{trace_id}/events").json()["events"]
                 if e["kind"] == "budget_exhausted"][-1]["data"]
    lacks = Decimal(exhausted["next_call_usd"]) - (Decimal("0.83") - Decimal(run["cost_usd"]))
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    page = console.page
    card = page.locator(".top-up")
    expect(card.locator(".budget-spent")).to_contain_text(f"Spent ${run['cost_usd']} of $0.83")
    expect(card.locator(".budget-spent")).to_contain_text(f"the next call may cost up to ${exhausted['next_call_usd']}")
    expect(page.locator(".meta .budget")).to_have_text("budget $0.83")
    expect(page.locator(".instance.status-succeeded")).to_have_count(done)
    expect(page.locator(".instance.status-running")).to_have_count(0)
    expect(page.locator(".step-card.status-running")).to_have_count(0)
    console.shot("budget-paused-map")
    proposed = page.get_by_label("Add (USD)").input_value()
    assert Decimal(proposed) == max(lacks, Decimal("0.01")).quantize(Decimal("0.01"), ROUND_CEILING), proposed
    page.get_by_role("button", name="Raise the budget").click()
    raised = usd_text(Decimal("0.83") + Decimal(proposed))
    expect(page.locator(".meta .budget")).to_have_text(f"budget ${raised}")
    run = paused(http, trace_id, 2)  # what the top-up pays for, then a pause again
    assert run["status"] == "waiting_budget" and run["budget_usd"] == raised, run["status"]
    more = len([s for s in run["steps"] if s["path"].startswith("m[") and s["status"] == "succeeded"])
    assert more > done
    expect(page.locator(".instance.status-succeeded")).to_have_count(more)
    expect(page.locator(".notice.resumed")).to_contain_text("The budget was raised")
    page.get_by_label("Add (USD)").fill("1")
    page.get_by_role("button", name="Raise the budget").click()
    expect(page.locator("#outcome")).to_have_text("Run succeeded", timeout=20_000)
    expect(page.locator(".meta .budget")).to_have_text(f"budget ${usd_text(Decimal(raised) + 1)}")
    text = page.locator("section.run").inner_text()
    assert "taken over" not in text and " times" not in text, text[:2000]
    console.shot("budget-topped-up-map")
    assert console.errors == []
