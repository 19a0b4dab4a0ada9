"""Versions and forks in the console (SPEC §13), in Chromium against a real server and the
fake LLM: a template's versions listed under its editor with a side-by-side diff of two
of them and a restore; "fork from here" on a run's step, its output edited in the form
of the step's output_schema (the server's 422 at the field), the fork's reused steps
marked and only what follows the step sent to the model."""

from __future__ import annotations

import time

from playwright.sync_api import expect

from tests.console.conftest import Console
from tests.console.test_console_language import api, make_worker

SCHEMA = {"type": "object", "required": ["ok", "score"],
          "properties": {"ok": {"type": "boolean"}, "score": {"type": "integer", "maximum": 10}}}


def test_versions_side_by_side_and_restore(console: Console):
    page = console.page
    http = api(console)
    steps = [{"id": "ask", "agent": {"human": True}, "prompt": "first question"},
             {"id": "gone", "agent": {"human": True}, "prompt": "removed later"}]
    tid = http.post("/workflow/template", json={"name": "versioned", "steps": steps}).json()["template_id"]
    changed = [{"id": "ask", "agent": {"human": True}, "prompt": "second question"},
               {"id": "fresh", "agent": {"human": True}, "prompt": "added"}]
    assert http.put(f"/workflow/template/{tid}", json={"name": "versioned", "steps": changed}).status_code == 200
    console.sign_in("root")
    console.open(f"templates/{tid}")
    versions = page.locator("section.versions")
    expect(versions.locator("tr[data-version]")).to_have_count(2)
    diff = versions.locator(".version-diff")
    expect(diff).to_have_attribute("data-from", "1")
    ask = diff.locator('.diff-row.changed[data-step="ask"]')
    expect(ask.locator(".diff-old")).to_contain_text("first question")
    expect(ask.locator(".diff-new")).to_contain_text("second question")
    expect(ask.locator("h4")).to_contain_text("prompt")
    expect(diff.locator('.diff-row.removed[data-step="gone"] .diff-old')).to_contain_text("removed later")
    expect(diff.locator('.diff-row.added[data-step="fresh"] .diff-new')).to_contain_text("added")
    console.shot("versions-diff")
    versions.get_by_role("button", name="Restore version 1").click()
    versions.get_by_role("button", name="Restore it").click()
    expect(page.locator(".notice")).to_contain_text("restored as version 3")
    expect(versions.locator("tr[data-version]")).to_have_count(3)
    assert http.get(f"/workflow/template/{tid}").json()["template"]["steps"][0]["prompt"] == "first question"
    assert page.get_by_label("Prompt").first.input_value() == "first question"  # the editor shows it
    assert console.errors == []


def test_fork_from_a_step_with_its_output_edited_in_the_schema_form(console: Console, fake):
    page = console.page
    http = api(console)
    worker = make_worker(http, fake.base_url)
    steps = [{"id": "draft", "agent": {"worker": worker}, "prompt": "draft {{input}}"},
             {"id": "review", "agent": {"worker": worker}, "prompt": "review {{steps.draft.output}}",
              "depends_on": ["draft"], "output_schema": SCHEMA},
             {"id": "final", "agent": {"worker": worker}, "prompt": "final {{steps.review.output}}",
              "depends_on": ["review"]}]
    tid = http.post("/workflow/template", json={"name": "forkable", "steps": steps}).json()["template_id"]
    source = http.post("/workflow/run", json={"template_id": tid, "input": "x"}).json()["trace_id"]
    for _ in range(200):
        if http.get(f"/workflow/run/{source}").json()["status"] == "succeeded":
            break
        time.sleep(0.05)
    calls = len(fake.chat_requests)
    console.sign_in("root")
    console.open(f"run/{source}")
    review = page.locator('article.step-card[data-step="review"]')
    review.get_by_role("button", name="Fork from here").click()
    panel = review.locator("form.fork-panel")
    panel.get_by_label("score").fill("11")
    panel.get_by_role("button", name="Fork with this output").click()
    panel.locator('[data-field="score"] .problem').get_by_text("maximum").wait_for()  # the server's 422
    panel.get_by_label("ok").uncheck()
    panel.get_by_label("score").fill("3")
    panel.get_by_role("button", name="Fork with this output").click()
    page.wait_for_url(lambda url: "#/run/" in url and not url.endswith(source))
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded")
    expect(page.locator('article.step-card[data-step="draft"] .reused')).to_have_text("reused")
    expect(page.locator('article.step-card[data-step="review"] .reused')).to_have_text("set by the fork")
    expect(page.locator("span.forked")).to_contain_text("forked from")
    console.shot("fork-run")
    fork = page.url.rsplit("/", 1)[1]
    run = http.get(f"/workflow/run/{fork}").json()
    assert run["forked_from"]["trace_id"] == source
    assert [s["output"] for s in run["steps"] if s["step_id"] == "review"] == [{"ok": False, "score": 3}]
    prompts = [r["messages"][-1]["content"] for r in fake.chat_requests[calls:]]
    assert prompts == ['final {"ok":false,"score":3}']
    assert console.errors == []
