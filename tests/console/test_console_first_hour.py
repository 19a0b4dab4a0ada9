"""What a new user met in the console's first hour, in Chromium against a real server:
renaming a step that others depend on (and refer to) saves; a stale dependency can be
removed in the editor; a new step is a worker's, and without workers the editor says to
create one and never sends `worker ''`; the worker form is empty again after a create;
parallel steps are listed as parallel; and at 390 px no card's content is wider than the
card on any page, with data in every table."""

from __future__ import annotations

import json
import re

import httpx
from playwright.sync_api import expect

from tests.console.conftest import PASSWORD, Console

LONG_URL = "http://fake-model.internal.example.org:9999/v1/some/rather/long/path/to/the/endpoint"


def api(console: Console, user_name: str) -> httpx.Client:
    token = httpx.post(f"{console.server.base_url}/api/v1/auth/login",
                       json={"user_name": user_name, "password": PASSWORD}).json()["access_token"]
    return httpx.Client(base_url=console.server.base_url + "/api/v1",
                        headers={"Authorization": f"Bearer {token}"}, timeout=15)


def step(page, index: int):
    return page.locator(f'fieldset[data-step-index="{index}"]')


def add_provider(http: httpx.Client, fake_url: str, name: str = "fake") -> str:
    made = http.post("/provider", json={"name": name, "provider": "openai_compatible", "model_id": "fake-model",
                                        "base_url": fake_url, "api_key": "any-key"})
    assert made.status_code == 201, made.text
    return made.json()["provider_id"]


def test_renaming_a_step_with_dependants_saves_and_carries_them_along(console: Console, fake):
    page = console.page
    http = api(console, "root")
    add_provider(http, fake.base_url)
    console.sign_in("root")
    # A worker made in the form: the form is empty again after "created".
    console.open("workers")
    page.get_by_role("heading", name="New worker").wait_for()
    page.get_by_label("Name", exact=True).fill("writer")
    page.get_by_label("Description", exact=True).fill("writes")
    page.get_by_role("button", name="Create worker").click()
    page.get_by_text("Worker 'writer' created.").wait_for()
    expect(page.get_by_label("Name", exact=True)).to_have_value("")
    expect(page.get_by_label("Description", exact=True)).to_have_value("")
    (worker,) = http.get("/agent/worker").json()["workers"]

    console.open("templates/new")
    page.get_by_role("heading", name="New template").wait_for()
    page.get_by_label("Name", exact=True).fill("chain")
    expect(step(page, 0).get_by_label("Agent")).to_have_value("worker")  # a worker's, by default
    expect(step(page, 0).get_by_label("Worker")).to_have_value(worker["worker_id"])  # the first one
    page.get_by_role("button", name="Add a step").click()
    page.get_by_role("button", name="Add a step").click()
    expect(step(page, 1).get_by_label("Prompt")).to_have_value("{{steps.step1.output}}")
    expect(step(page, 1).get_by_role("checkbox", name="step1")).to_be_checked()
    # Rename the first step keystroke by keystroke (through an empty id), the second at once.
    step(page, 0).get_by_label("Step id").fill("")
    step(page, 0).get_by_label("Step id").press_sequentially("facts")
    step(page, 1).get_by_label("Step id").fill("summary")
    expect(step(page, 1).get_by_role("checkbox", name="facts")).to_be_checked()
    expect(step(page, 1).get_by_label("Prompt")).to_have_value("{{steps.facts.output}}")
    expect(step(page, 2).get_by_role("checkbox", name="summary")).to_be_checked()
    expect(step(page, 2).get_by_label("Prompt")).to_have_value("{{steps.summary.output}}")
    assert page.locator(".badge.unknown").count() == 0
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'chain' created.").wait_for()
    page.wait_for_url(re.compile(r"#/templates/[0-9a-f-]{36}$"))
    template_id = page.url.rsplit("/", 1)[1]
    saved = http.get(f"/workflow/template/{template_id}").json()["template"]
    assert [(s["id"], s["depends_on"], s["prompt"]) for s in saved["steps"]] == [
        ("facts", [], "{{input}}"), ("summary", ["facts"], "{{steps.facts.output}}"),
        ("step3", ["summary"], "{{steps.summary.output}}")]

    # A dependency on a step that does not exist (written in the JSON tab) is removed in the editor.
    page.get_by_role("button", name="JSON").click()
    editor = page.get_by_label("Template as JSON")
    body = json.loads(editor.input_value())
    body["steps"][2]["depends_on"].append("ghost")
    editor.fill(json.dumps(body))
    page.get_by_role("button", name="Step editor").click()
    step(page, 2).get_by_text("ghost (unknown)").wait_for()
    step(page, 2).get_by_role("button", name="Remove the dependency on ghost").click()
    expect(step(page, 2).locator(".badge.unknown")).to_have_count(0)
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'chain' saved.").wait_for()
    saved = http.get(f"/workflow/template/{template_id}").json()["template"]
    assert saved["steps"][2]["depends_on"] == ["summary"]

    # A field the step editor has no control for is kept, and an expression in it follows a rename.
    page.get_by_role("button", name="JSON").click()
    body = json.loads(editor.input_value())
    body["steps"][2]["when"] = "steps.summary.output != ''"
    editor.fill(json.dumps(body))
    page.get_by_role("button", name="Step editor").click()
    step(page, 1).get_by_label("Step id").fill("digest")
    with page.expect_response(lambda r: r.request.method == "PUT") as answer:
        page.get_by_role("button", name="Save template").click()
    assert answer.value.status == 200, answer.value.text()
    saved = http.get(f"/workflow/template/{template_id}").json()["template"]
    assert [(s["id"], s["depends_on"], s["prompt"], s.get("when")) for s in saved["steps"][1:]] == [
        ("digest", ["facts"], "{{steps.facts.output}}", None),
        ("step3", ["digest"], "{{steps.digest.output}}", "steps.digest.output != ''")]

    # The list shows steps that run side by side as such.
    http.post("/workflow/template", json={"name": "fan", "steps": [
        {"id": "facts", "agent": {"worker": worker["worker_id"]}, "prompt": "a", "depends_on": []},
        {"id": "numbers", "agent": {"worker": worker["worker_id"]}, "prompt": "b", "depends_on": []},
        {"id": "report", "agent": {"human": True}, "prompt": "c", "depends_on": ["facts", "numbers"]}]})
    console.open("templates")
    expect(page.locator("tr", has_text="fan").locator(".stages")).to_have_text("facts & numbers → report")
    expect(page.locator("tr", has_text="chain").locator(".stages")).to_have_text("facts → digest → step3")
    assert console.errors == []


def test_without_workers_the_editor_says_to_create_one_and_sends_no_empty_worker(console: Console):
    page = console.page
    http = api(console, "root")
    console.sign_in("root")
    console.open("templates/new")
    page.get_by_role("heading", name="New template").wait_for()
    page.get_by_label("Name", exact=True).fill("nobody")
    hint = step(page, 0).locator(".no-workers")
    expect(hint).to_contain_text("Create a worker first")
    expect(hint.get_by_role("link", name="Workers")).to_have_attribute("href", "#/workers")
    posted = []
    page.on("request", lambda r: r.method == "POST" and r.url.endswith("/workflow/template") and posted.append(r))
    page.get_by_role("button", name="Save template").click()
    page.get_by_role("alert").filter(has_text="Choose a worker for every step").wait_for()
    step(page, 0).locator(".problem").filter(has_text="choose a worker").wait_for()
    assert posted == [] and http.get("/workflow/template").json()["templates"] == []
    # A system node says what it does.
    step(page, 0).get_by_label("Agent").select_option("node")
    step(page, 0).get_by_label("System node").select_option("reviewer")
    expect(step(page, 0)).to_contain_text("The reviewer checks work for errors and gaps")
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'nobody' created.").wait_for()


OVERFLOWING = """() => {
  const cards = [...document.querySelectorAll('main, section, .card, .table-wrap, figure.graph, fieldset, .step-card, form')];
  const out = [];
  for (const card of cards) {
    const box = card.getBoundingClientRect();
    if (!box.width) continue;
    const name = card.tagName.toLowerCase() + (card.className ? '.' + String(card.className).split(' ').join('.') : '');
    if (card.scrollWidth > card.clientWidth + 1) out.push(`${name}: scrollWidth ${card.scrollWidth} > clientWidth ${card.clientWidth}`);
    for (const inner of card.querySelectorAll('*')) {
      const r = inner.getBoundingClientRect();
      if (r.width && r.height && r.right > box.right + 1) {
        out.push(`${name}: ${inner.tagName.toLowerCase()} "${(inner.textContent || '').trim().slice(0, 30)}" ends at ${Math.round(r.right)} > ${Math.round(box.right)}`);
        break;
      }
    }
  }
  if (document.documentElement.scrollWidth > innerWidth) out.push(`page: ${document.documentElement.scrollWidth} > ${innerWidth}`);
  return out;
}"""


def fill_every_table(console: Console, fake) -> tuple[str, str]:
    """Providers (one with a long base URL), workers, templates, a finished run, a run
    waiting on a multi-line question, users: every table and graph has rows."""
    http = api(console, "root")
    provider = add_provider(http, fake.base_url)
    add_provider(http, LONG_URL, name="far-away-provider-with-a-long-name")
    httpx.post(f"{console.server.base_url}/api/v1/auth/register",
               json={"user_name": "alice-with-a-rather-long-user-name", "password": PASSWORD})
    worker = http.post("/agent/worker", json={"name": "writer-of-long-reports", "provider_id": provider,
                                              "tools": ["calculator", "current_time"]}).json()["worker_id"]
    template = http.post("/workflow/template", json={"name": "three parallel then one", "steps": [
        {"id": f"s{i}", "agent": {"worker": worker}, "prompt": "{{input}}", "depends_on": []} for i in range(3)] + [
        {"id": "last-step-of-all", "agent": {"worker": worker}, "prompt": "join", "depends_on": ["s0", "s1", "s2"]}]})
    assert template.status_code == 201, template.text
    finished = http.post("/workflow/run", json={"template_id": template.json()["template_id"], "input": "x"}).json()
    asking = http.post("/workflow/template", json={"name": "asks", "steps": [
        {"id": "ask", "agent": {"human": True}, "prompt": "First line.\nSecond line.\nWhat now?", "depends_on": []}]})
    waiting = http.post("/workflow/run", json={"template_id": asking.json()["template_id"], "input": ""}).json()
    streamed = httpx.get(f"{console.server.base_url}/api/v1/workflow/sse/{finished['trace_id']}",
                         headers=http.headers, timeout=60)  # the stream closes after the run's end
    assert streamed.status_code in (200, 204)
    assert http.get(f"/workflow/run/{finished['trace_id']}").json()["status"] == "succeeded"
    return finished["trace_id"], waiting["trace_id"]


def test_at_390_px_no_card_is_wider_than_its_content_allows(chromium, served, screenshots, fake):
    console = Console(chromium, served, screenshots, width=390, height=844)
    try:
        page = console.page
        console.open("register")
        page.get_by_role("heading", name="Create an account").wait_for()
        assert page.evaluate(OVERFLOWING) == []
        finished, waiting = fill_every_table(console, fake)
        console.sign_in("root")
        template_id = api(console, "root").get("/workflow/template").json()["templates"][0]["template_id"]
        # Every page of the navigation (a page added later is checked too), and the item pages.
        listed = [href.removeprefix("#/") for href in page.locator("header.top nav a").evaluate_all(
            "links => links.map((a) => a.getAttribute('href'))")]
        assert {"runs", "templates", "workers", "providers", "users"} <= set(listed), listed
        pages = listed + [f"run/{finished}", f"run/{waiting}", f"templates/{template_id}", "templates/new"]
        for fragment in pages:
            console.open(fragment)
            page.locator("main h1").first.wait_for()
            page.wait_for_load_state("networkidle")
            if fragment.startswith("run/"):
                page.locator("figure.graph g.node").first.wait_for()
            if fragment in ("runs", "templates", "workers", "providers", "users"):  # filled above
                page.locator("tbody tr td:not([colspan])").first.wait_for()  # the table has rows
            console.shot(f"390-{fragment.replace('/', '-')[:40]}")
            assert page.evaluate(OVERFLOWING) == [], fragment
        # The run graph shows every step, the last one too, inside its card.
        console.open(f"run/{finished}")
        page.locator('figure.graph g.node[data-step="last-step-of-all"]').wait_for()
        # A question keeps its line breaks.
        console.open(f"run/{waiting}")
        question = page.locator(".question .prompt-text")
        question.wait_for()
        assert question.inner_text() == "First line.\nSecond line.\nWhat now?"
        assert console.errors == []
    finally:
        console.close()
