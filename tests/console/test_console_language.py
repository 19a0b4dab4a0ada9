"""The workflow language in the console, in Chromium against a real server and the fake
LLM: a run started from a form made of the template's `input_schema` (a 422 shown at the
field); a human step with an `output_schema` answered through a form (the server's 422 at
the field, then the stored reply); a foreach of 300 items grouped under its container,
counted by status, collapsed and paged (never 300 rows in the page), and a loop's
iterations with their inner steps, also at 390 px; the template editor's controls for
when, timeout, retry, on_error, output_schema, default, input_schema, limits, output and
foreach/loop containers, saved and read back through the API, with the server's 422s at
their fields, and the graph's dashed conditional arrows and container boxes; a step run
again by its `retry` (its second attempt's text only) and one skipped by its `when`; the
questions of a foreach's human items answered in their rows, and a human step's default
shown when its timeout passes."""

from __future__ import annotations

import json

import httpx
from playwright.sync_api import expect

from tests.console.conftest import PASSWORD, Console
from tests.console.test_console_first_hour import OVERFLOWING


def api(console: Console, user_name: str = "root") -> httpx.Client:
    token = httpx.post(f"{console.server.base_url}/api/v1/auth/login",
                       json={"user_name": user_name, "password": PASSWORD}).json()["access_token"]
    return httpx.Client(base_url=console.server.base_url + "/api/v1",
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)


def make_worker(http: httpx.Client, fake_url: str) -> str:
    provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible", "model_id": "fake-model",
                                            "base_url": fake_url, "api_key": "any-key"})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "researcher", "provider_id": provider.json()["provider_id"]})
    assert worker.status_code == 201, worker.text
    return worker.json()["worker_id"]


def all_events(http: httpx.Client, trace_id: str) -> list[dict]:
    events, after = [], 0
    while True:
        page = http.get(f"/workflow/run/{trace_id}/events", params={"after": after}).json()
        events += page["events"]
        if not page["events"] or page.get("next_after") is None:
            return events
        after = page["next_after"]


REVIEW_SCHEMA = {
    "type": "object", "required": ["approved", "score"],
    "properties": {
        "approved": {"type": "boolean"},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "level": {"enum": ["low", "high"]},
        "note": {"type": "string"},
    },
}


def test_input_form_and_a_human_reply_through_a_form_from_the_schema(console: Console):
    page = console.page
    http = api(console)
    made = http.post("/workflow/template", json={
        "name": "approve",
        "input_schema": {"type": "object", "required": ["count", "topic"],
                         "properties": {"count": {"type": "integer", "minimum": 1}, "topic": {"type": "string"}}},
        "steps": [{"id": "review", "agent": {"human": True}, "prompt": "Approve {{ input.count }} on {{ input.topic }}?",
                   "output_schema": REVIEW_SCHEMA}]})
    assert made.status_code == 201, made.text
    console.sign_in("root")
    console.open("runs")
    start = page.locator("form").filter(has=page.get_by_role("heading", name="Start a run"))
    start.get_by_label("count").fill("0")
    start.get_by_label("topic").fill("tides")
    start.get_by_role("button", name="Start run").click()
    # The server's 422 (`input.count`) at the field.
    start.locator('[data-field="count"] .problem').get_by_text("minimum").wait_for()
    assert http.get("/workflow/run").json()["runs"] == []
    start.get_by_label("count").fill("2")
    start.get_by_role("button", name="Start run").click()
    page.wait_for_url("**/#/run/*")
    trace_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("section.run")).to_contain_text('"topic": "tides"')

    reply = page.locator("form.reply")
    reply.get_by_text("review asks:").wait_for()
    reply.get_by_label("approved").check()
    reply.get_by_label("score").fill("11")
    reply.get_by_label("level (optional)").select_option(label="high")
    reply.get_by_label("note (optional)").fill("fine by me")
    reply.get_by_role("button", name="Send reply").click()
    # Refused by the server at `content.score`; the question stays open.
    reply.locator('[data-field="score"] .problem').get_by_text("maximum").wait_for()
    console.shot("language-reply-refused")
    assert http.get(f"/workflow/run/{trace_id}").json()["status"] == "waiting_reply"
    reply.get_by_label("score").fill("7")
    reply.get_by_role("button", name="Send reply").click()
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded")
    run = http.get(f"/workflow/run/{trace_id}").json()
    (review,) = [s for s in run["steps"] if s["path"] == "review"]
    assert review["output"] == {"approved": True, "score": 7, "level": "high", "note": "fine by me"}
    assert run["input"] == {"count": 2, "topic": "tides"}
    assert console.errors == []


def test_a_foreach_of_300_items_is_grouped_counted_and_paged(console: Console, fake):
    page = console.page
    http = api(console)
    worker = make_worker(http, fake.base_url)
    # Every 100th item (7, 107, 207) has no topic: its prompt fails, and `continue` goes on.
    items = [{"topic": f"topic {i}"} if i % 100 != 7 else {"other": i} for i in range(300)]
    made = http.post("/workflow/template", json={
        "name": "map", "input_schema": {"type": "object", "properties": {"items": {"type": "array"}}},
        "steps": [{"id": "each", "foreach": {"items": "input.items", "max_concurrency": 16, "on_error": "continue"},
                   "agent": {"worker": worker}, "prompt": "Research {{ item.topic }}"},
                  {"id": "improve", "depends_on": ["each"], "loop": {
                      "steps": [{"id": "polish", "agent": {"worker": worker}, "prompt": "Polish {{ loop.iteration }}"}],
                      "until": "false", "max_iterations": 2}}]})
    assert made.status_code == 201, made.text
    console.sign_in("root")
    console.open(f"runs?template={made.json()['template_id']}")
    start = page.locator("form").filter(has=page.get_by_role("heading", name="Start a run"))
    # An array property: the form falls back to JSON.
    start.get_by_label("Input (JSON)").fill(json.dumps({"items": items}))
    start.get_by_role("button", name="Start run").click()
    page.wait_for_url("**/#/run/*")
    trace_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded", timeout=120_000)

    # What the server says: the container's output and its counts, and the failed items' events.
    stored = {s["path"]: s for s in http.get(f"/workflow/run/{trace_id}").json()["steps"]}
    assert [i for i, out in enumerate(stored["each"]["output"]) if out is None] == [7, 107, 207]
    events = all_events(http, trace_id)
    (summary,) = [e["data"]["items"] for e in events if e["kind"] == "step_finished" and e["data"]["path"] == "each"]
    assert summary == {"total": 300, "succeeded": 297, "failed": 3}
    assert sorted(e["data"]["path"] for e in events if e["kind"] == "step_failed") == ["each[107]", "each[207]", "each[7]"]
    group = page.locator('.instances[data-container="each"]')
    expect(group).to_have_attribute("data-total", "300")
    expect(group.locator('button.count[data-status="succeeded"]')).to_have_text("succeeded 297")
    expect(group.locator('button.count[data-status="failed"]')).to_have_text("failed 3")
    # Collapsed by default: no item rows in the page until asked.
    assert group.locator("li.instance").count() == 0
    group.get_by_role("button", name="Show 300 items").click()
    expect(group.locator("li.instance")).to_have_count(50)
    expect(group.locator(".page-at")).to_have_text("items 1–50 of 300")
    first = group.locator('li.instance[data-path="each[0]"]')
    expect(first).to_contain_text("Echo: Research topic 0")
    group.get_by_role("button", name="Next 50").click()
    expect(group.locator(".page-at")).to_have_text("items 51–100 of 300")
    expect(group.locator("li.instance").first).to_have_attribute("data-path", "each[50]")
    expect(group.locator("li.instance")).to_have_count(50)
    console.shot("language-foreach-paged")
    # The failed ones, by their count.
    group.locator('button.count[data-status="failed"]').click()
    expect(group.locator("li.instance")).to_have_count(3)
    assert group.locator("li.instance").evaluate_all("rows => rows.map((r) => r.dataset.path)") == \
        ["each[7]", "each[107]", "each[207]"]
    expect(group.locator('li.instance[data-path="each[107]"] .error')).to_contain_text("item.topic")
    assert group.locator("li.instance").count() <= 50
    # The loop: two iterations, small enough to be open, each with its inner step's output.
    loop = page.locator('.instances[data-container="improve"]')
    expect(loop.locator('button.count[data-status="succeeded"]')).to_have_text("succeeded 2")
    expect(loop.locator("li.instance[data-path='improve#2'] li.instance[data-path='improve#2.polish']")).to_contain_text(
        "Echo: Polish 2")
    expect(loop.locator("li.instance[data-path='improve#1']")).to_contain_text("iteration 1")
    expect(page.locator('article[data-step="improve"]')).to_contain_text("Stopped after 2 iterations")
    # At 390 px the run view's groups fit their cards.
    page.set_viewport_size({"width": 390, "height": 844})
    console.open(f"templates/{made.json()['template_id']}")
    page.get_by_role("heading", name="Template map").wait_for()
    page.locator('figure.graph g.node.container[data-step="improve"]').wait_for()
    expect(page.get_by_label("Input schema (JSON Schema)")).to_be_visible()  # open: the template has one
    for summary in page.locator("details.policies > summary").all():
        summary.click()
    expect(page.get_by_label("Output schema (JSON Schema)")).to_have_count(3)  # each, improve, and improve's polish
    assert page.evaluate(OVERFLOWING) == []
    console.shot("language-editor-390")
    console.open(f"run/{trace_id}")
    group.get_by_role("button", name="Show 300 items").click()
    expect(group.locator("li.instance")).to_have_count(50)
    assert page.evaluate(OVERFLOWING) == []
    console.shot("language-foreach-390")
    assert console.errors == []


def step(page, index: int):
    return page.locator(f'fieldset[data-step-index="{index}"]')


def field(scope, label: str):
    """The `.field` block of the control labelled `label`: its problem is shown inside."""
    return scope.locator(".field").filter(has=scope.page.get_by_label(label, exact=True))


def test_the_editor_saves_when_timeout_retry_and_containers_and_shows_422s_at_their_fields(console: Console, fake):
    page = console.page
    http = api(console)
    make_worker(http, fake.base_url)
    console.sign_in("root")
    console.open("templates/new")
    page.get_by_role("heading", name="New template").wait_for()
    page.get_by_label("Name", exact=True).fill("guarded")
    step(page, 0).get_by_label("Step id").fill("draft")
    first = step(page, 0)
    first.get_by_text("Conditions and policies").click()
    first.get_by_label("Timeout (seconds)").fill("120")
    first.get_by_label("Attempts").fill("50")  # more than 10: the server refuses it
    first.get_by_label("Backoff (seconds)").fill("2")
    first.get_by_label("On error").select_option("continue")
    page.get_by_role("button", name="Add a step").click()
    second = step(page, 1)
    second.get_by_label("Step id").fill("approve")
    second.get_by_label("Agent").select_option("human")
    second.get_by_label("Prompt").fill("Approve {{steps.draft.output}}?")
    second.get_by_text("Conditions and policies").click()
    second.get_by_label("Run only when").fill("steps.draft.output != ''")
    second.get_by_label("Timeout (seconds)").fill("60")
    second.get_by_label("Output schema (JSON Schema)").fill(json.dumps(
        {"type": "object", "required": ["approved"], "properties": {"approved": {"type": "boolean"}}}))
    second.get_by_label("Default reply").fill('{"approved": false}')
    page.get_by_role("button", name="Add a step").click()
    third = step(page, 2)
    third.get_by_label("Step id").fill("each")
    third.get_by_label("Runs").select_option("foreach")
    third.get_by_label("Items").fill("['a', 'b']")
    third.get_by_label("At once").fill("2")
    third.get_by_label("When an item fails").select_option("continue")
    third.get_by_label("Prompt").fill("Research {{item}}")
    page.get_by_text("Input, limits and output").click()
    page.get_by_label("Max steps").fill("40")
    page.get_by_label("Run output").fill("steps.each.output")

    page.get_by_role("button", name="Save template").click()
    # The 422 names `steps.0.retry.max_attempts`: shown at that step's Attempts field.
    field(first, "Attempts").locator(".problem").get_by_text("less than or equal to 10").wait_for()
    assert field(second, "Attempts").locator(".problem").count() == 0
    console.shot("language-editor-422-retry")
    first.get_by_label("Attempts").fill("3")
    second.get_by_label("Run only when").fill("steps.draft.output ==")  # does not parse
    page.get_by_role("button", name="Save template").click()
    field(second, "Run only when").locator(".problem").wait_for()
    assert field(first, "Attempts").locator(".problem").count() == 0
    assert http.get("/workflow/template").json()["templates"] == []
    second.get_by_label("Run only when").fill("steps.draft.output != ''")
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'guarded' created.").wait_for()

    (stored,) = http.get("/workflow/template").json()["templates"]
    draft, approve, each = stored["steps"]
    assert (draft["timeout_seconds"], draft["retry"], draft["on_error"]) == (120, {"max_attempts": 3, "backoff_seconds": 2}, "continue")
    assert draft["agent"] == {"worker": "researcher"}  # read back by name (SPEC §7)
    assert approve["when"] == "steps.draft.output != ''" and approve["timeout_seconds"] == 60
    assert approve["agent"] == {"human": True} and approve["depends_on"] == ["draft"]
    assert approve["output_schema"]["properties"] == {"approved": {"type": "boolean"}}
    assert approve["default"] == {"approved": False}
    assert each["foreach"] == {"items": "['a', 'b']", "max_concurrency": 2, "on_error": "continue"}
    assert each["prompt"] == "Research {{item}}" and each["depends_on"] == ["approve"]
    assert stored["limits"] == {"max_steps": 40} and stored["output"] == "steps.each.output"

    # The graph: the conditional step's arrow dashed, the foreach a box around its item step.
    graph = page.locator("figure.graph")
    expect(graph.locator('g.node.conditional[data-step="approve"]')).to_have_count(1)
    expect(graph.locator("path.edge.conditional")).to_have_count(1)
    expect(graph.locator('g.node.container[data-kind="foreach"][data-step="each"] g.node.item')).to_have_count(1)

    # A loop: its iteration's steps are a step form; a problem inside them is shown at that step's field.
    page.get_by_role("button", name="Add a step").click()
    fourth = step(page, 3)
    fourth.get_by_label("Step id").fill("improve")
    fourth.get_by_label("Runs").select_option("loop")
    fourth.get_by_label("Max iterations").fill("2")
    fourth.get_by_label("Until").fill("steps.polish.output != ''")
    polish = fourth.locator('.inner-editor fieldset[data-inner-index="0"]')  # the iteration's steps: a step form
    polish.get_by_label("Step id").fill("polish")
    polish.get_by_label("Prompt").fill("Polish {{ steps.nope.output }}")
    page.get_by_role("button", name="Save template").click()
    field(polish, "Prompt").locator(".problem").get_by_text("nope").wait_for()
    polish.get_by_label("Prompt").fill("Polish {{ loop.iteration }}")
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'guarded' saved.").wait_for()
    (stored,) = http.get("/workflow/template").json()["templates"]
    improve = stored["steps"][3]
    assert improve["loop"]["max_iterations"] == 2 and improve["loop"]["until"] == "steps.polish.output != ''"
    assert improve["loop"]["steps"][0]["id"] == "polish" and "agent" not in improve
    expect(graph.locator('g.node.container[data-kind="loop"][data-step="improve"] g.node[data-step="polish"]')).to_have_count(1)
    console.shot("language-editor-saved")
    assert console.errors == []


def test_a_retried_step_and_a_skipped_one_say_so(console: Console, fake):
    page = console.page
    http = api(console)
    worker = make_worker(http, fake.base_url)
    fake.script_error(400, "The first attempt is refused")  # not retried by the client: the step's retry runs
    made = http.post("/workflow/template", json={"name": "policies", "steps": [
        {"id": "flaky", "agent": {"worker": worker}, "prompt": "{{input}}", "retry": {"max_attempts": 2}},
        {"id": "never", "agent": {"worker": worker}, "prompt": "x", "depends_on": ["flaky"], "when": "input == 'other'"},
        {"id": "after", "agent": {"worker": worker}, "prompt": "{{input}} again", "depends_on": ["flaky"]}]})
    assert made.status_code == 201, made.text
    trace_id = http.post("/workflow/run", json={"template_id": made.json()["template_id"], "input": "hello"}).json()["trace_id"]
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded")
    steps = {s["path"]: s for s in http.get(f"/workflow/run/{trace_id}").json()["steps"]}
    assert (steps["flaky"]["attempt"], steps["flaky"]["status"], steps["never"]["status"]) == (2, "succeeded", "skipped")
    flaky = page.locator('article[data-step="flaky"]')
    expect(flaky).to_contain_text("run 2 times")
    expect(flaky.locator("pre.stream")).to_have_text("Echo: hello")  # the second attempt's text only
    never = page.locator('article[data-step="never"]')
    expect(never.locator(".badge")).to_have_text("skipped")
    expect(never).to_contain_text("Skipped: its condition was false.")
    expect(page.locator('figure.graph g.node.status-skipped[data-step="never"]')).to_have_count(1)
    assert console.errors == []


def test_questions_of_foreach_items_are_answered_in_their_rows_and_a_timed_out_one_shows_its_default(console: Console):
    page = console.page
    http = api(console)
    made = http.post("/workflow/template", json={
        "name": "rate", "input_schema": {"type": "array", "items": {"type": "string"}},
        "steps": [
            {"id": "ask", "foreach": {"items": "input"}, "agent": {"human": True}, "prompt": "Rate {{item}}",
             "output_schema": {"type": "object", "required": ["score"], "properties": {"score": {"type": "integer"}}}},
            {"id": "late", "agent": {"human": True}, "prompt": "Anything else?", "depends_on": ["ask"],
             "timeout_seconds": 1, "default": "nothing more"}]})
    assert made.status_code == 201, made.text
    trace_id = http.post("/workflow/run", json={"template_id": made.json()["template_id"], "input": ["tea", "coffee"]}).json()["trace_id"]
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    group = page.locator('.instances[data-container="ask"]')
    for path, score in [("ask[1]", "4"), ("ask[0]", "2")]:
        row = group.locator(f'li.instance[data-path="{path}"]')
        row.locator("form.reply").get_by_label("score").fill(score)
        row.get_by_role("button", name="Send reply").click()
        expect(row.locator(".badge").first).to_have_text("succeeded")
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded")
    steps = {s["path"]: s for s in http.get(f"/workflow/run/{trace_id}").json()["steps"]}
    assert steps["ask"]["output"] == [{"score": 2}, {"score": 4}]
    assert steps["late"]["output"] == "nothing more"
    expect(page.locator('article[data-step="late"] .answer')).to_have_text("No reply in time; the default: nothing more")
    assert console.errors == []


def test_a_template_is_offered_as_an_mcp_tool_with_its_output_schema(console: Console):
    """SPEC §14 in the editor: the run's output schema and 'Offer as an MCP tool'."""
    page = console.page
    http = api(console)
    console.sign_in("root")
    console.open("templates/new")
    page.get_by_role("heading", name="New template").wait_for()
    page.get_by_label("Name", exact=True).fill("offered")
    first = step(page, 0)
    first.get_by_label("Step id").fill("ask")
    first.get_by_label("Agent").select_option("human")
    first.get_by_label("Prompt").fill("Which queue?")
    page.get_by_text("Input, limits and output").click()
    page.get_by_label("Schema of the run's output (JSON Schema)").fill('{"type": "string"')
    expect(page.get_by_text("not JSON")).to_be_visible()
    page.get_by_label("Schema of the run's output (JSON Schema)").fill('{"type": "string", "maxLength": 20}')
    page.get_by_label("Offer as an MCP tool").check()
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'offered' created.").wait_for()
    (stored,) = http.get("/workflow/template").json()["templates"]
    assert stored["expose"] == {"mcp": True}
    assert stored["output_schema"] == {"type": "string", "maxLength": 20}
    console.shot("template-offered-as-mcp-tool")
    page.reload()  # the editor shows what is stored
    expect(page.get_by_label("Offer as an MCP tool")).to_be_checked()
    page.get_by_label("Offer as an MCP tool").uncheck()
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'offered' saved.").wait_for()
    (stored,) = http.get("/workflow/template").json()["templates"]
    assert "expose" not in stored and stored["output_schema"] == {"type": "string", "maxLength": 20}
