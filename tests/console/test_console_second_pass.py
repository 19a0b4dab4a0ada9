"""The console's second first hour (issue 29, point 10), in Chromium against a real server
and the fake LLM: a new step's *Runs* choice shows "once" before any save; the editor of a
six-step template is compact (empty JSON boxes are one line, boxes grow with their text),
*Run output* is a text area sized to its text, number fields look like text fields, and
help text never breaks inside a word on a phone; a container's inner steps are edited with
the same step form as top-level steps (a worker chosen by name); a foreach's items are
named by their value; "skipped" and "max iterations" notes are neutral, not success green;
on a phone the graph's labels stay readable and the navigation is a compact menu; a run
resumed after a restart while its question is open shows `waiting_reply`, as the API does.
Each test takes screenshots at 1280x800 and 390x844."""

from __future__ import annotations

import json

import httpx
from playwright.sync_api import expect

from tests.console.conftest import PASSWORD, Console
from tests.console.test_console_first_hour import OVERFLOWING

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def api(console: Console, user_name: str = "root") -> httpx.Client:
    token = httpx.post(f"{console.server.base_url}/api/v1/auth/login",
                       json={"user_name": user_name, "password": PASSWORD}).json()["access_token"]
    return httpx.Client(base_url=console.server.base_url + "/api/v1",
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)


def make_worker(http: httpx.Client, fake_url: str, name: str = "researcher") -> str:
    provider = http.post("/provider", json={"name": f"fake-{name}", "provider": "openai_compatible",
                                            "model_id": "fake-model", "base_url": fake_url, "api_key": "any-key"})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": name, "provider_id": provider.json()["provider_id"]})
    assert worker.status_code == 201, worker.text
    return worker.json()["worker_id"]


def step(scope, index: int):
    return scope.locator(f'fieldset[data-step-index="{index}"]')


def inner_step(scope, index: int):
    """Inner step `index` of the first container inside `scope`."""
    return scope.locator(".inner-editor").first.locator(f':scope > fieldset[data-inner-index="{index}"]')


def height(locator) -> float:
    box = locator.bounding_box()
    assert box is not None
    return box["height"]


# Places where a line ends between two letters or digits of one word ("maxI" / "tems").
MID_WORD_BREAKS = """(selector) => {
  const out = [];
  for (const el of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let prev = null;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const text = node.textContent;
      for (let i = 0; i < text.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rects = range.getClientRects();
        if (!rects.length) continue;
        const top = rects[0].top;
        if (prev && top > prev.top + 2 && /\\w/.test(prev.ch) && /\\w/.test(text[i])) {
          out.push(`"${prev.ch}|${text[i]}" in "${el.textContent.slice(0, 80)}"`);
        }
        prev = { ch: text[i], top };
      }
    }
  }
  return out;
}"""

# The smallest font size a graph's text is drawn at, in CSS pixels: its font size times the
# scale the picture is shrunk (or grown) by to fit its card.
SMALLEST_GRAPH_TEXT = """() => {
  let least = Infinity;
  for (const svg of document.querySelectorAll('figure.graph svg')) {
    const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    for (const t of svg.querySelectorAll('text')) {
      least = Math.min(least, parseFloat(getComputedStyle(t).fontSize) * scale);
    }
  }
  return least;
}"""

# A colour as the page computes it (`var(--ok)` → rgb(…)).
COLOUR_OF = """(value) => {
  const probe = document.createElement('span');
  probe.style.color = value;
  document.body.append(probe);
  const colour = getComputedStyle(probe).color;
  probe.remove();
  return colour;
}"""


def six_steps(worker: str) -> dict:
    """Six steps whose policy panels are all open (each has a policy), no output schema,
    no input schema, and limits (which open the template's own settings)."""
    return {
        "name": "six", "limits": {"max_steps": 50},
        "steps": [
            {"id": "plan", "agent": {"worker": worker}, "prompt": "{{input}}", "timeout_seconds": 60},
            {"id": "draft", "agent": {"worker": worker}, "prompt": "{{steps.plan.output}}", "depends_on": ["plan"],
             "retry": {"max_attempts": 2}},
            {"id": "check", "agent": {"worker": worker}, "prompt": "{{steps.draft.output}}", "depends_on": ["draft"],
             "on_error": "continue"},
            {"id": "ask", "agent": {"human": True}, "prompt": "Fine?", "depends_on": ["check"], "timeout_seconds": 600},
            {"id": "polish", "agent": {"worker": worker}, "prompt": "{{steps.draft.output}}", "depends_on": ["ask"],
             "when": "steps.ask.output != 'no'"},
            {"id": "publish", "agent": {"worker": worker}, "prompt": "{{steps.polish.output}}",
             "depends_on": ["polish"], "timeout_seconds": 30},
        ],
    }


def editor_of_six(console: Console, fake) -> tuple[httpx.Client, str, str]:
    """Signed in as root, with a worker and the six-step template: (api, worker, template id)."""
    console.page.set_viewport_size(DESKTOP)
    http = api(console)
    worker = make_worker(http, fake.base_url)
    made = http.post("/workflow/template", json=six_steps(worker))
    assert made.status_code == 201, made.text
    console.sign_in("root")
    return http, worker, made.json()["template_id"]


def open_template(console: Console, template_id: str, name: str) -> None:
    """The template's editor, loaded afresh (as stored)."""
    console.open(f"templates/{template_id}")
    console.page.reload()
    console.page.get_by_role("heading", name=f"Template {name}").wait_for()


def test_a_new_steps_runs_choice_shows_once_before_a_save(console: Console, fake):
    page = console.page
    editor_of_six(console, fake)
    console.open("templates/new")
    page.get_by_role("heading", name="New template").wait_for()
    page.get_by_role("button", name="Add a step").click()
    for index in (0, 1):
        runs = step(page, index).get_by_label("Runs")
        expect(runs).to_have_value("step")
        assert runs.evaluate("(s) => s.selectedIndex >= 0 && s.options[s.selectedIndex].text") == "once"
    step(page, 1).get_by_text("Conditions and policies").click()
    blank = page.locator("main select").evaluate_all("(all) => all.filter((s) => s.selectedIndex < 0).map((s) => s.id)")
    assert blank == []  # no select without a choice shown
    console.shot("second-new-step-1280")
    page.set_viewport_size(PHONE)
    console.shot("second-new-step-390")
    assert console.errors == []


def test_empty_json_boxes_are_one_line_and_grow_with_their_text(console: Console, fake):
    page = console.page
    _, _, template_id = editor_of_six(console, fake)
    open_template(console, template_id, "six")
    expect(page.locator("details.policies[open]")).to_have_count(6)
    expect(page.locator("details.template-settings[open]")).to_have_count(1)
    tall = height(page.locator("main form").first)
    console.shot("second-editor-six-1280")
    schemas = page.get_by_label("Output schema (JSON Schema)")
    expect(schemas).to_have_count(6)
    line = page.get_by_label("Step id").first
    for box in schemas.all() + [page.get_by_label("Input schema (JSON Schema)")]:
        assert height(box) <= height(line) + 8, (height(box), height(line))  # one line, like a text field
    # A JSON box grows with its text, and never scrolls inside.
    schema = page.get_by_label("Input schema (JSON Schema)")
    schema.fill(json.dumps({"type": "object", "properties": {"topic": {"type": "string"}, "count": {"type": "integer"}}},
                           indent=2))
    assert schema.evaluate("(t) => t.scrollHeight <= t.clientHeight + 2")
    assert height(schema) > 5 * height(line)
    console.shot("second-editor-schema-1280")
    # On a phone the empty input schema is one line too, not a screenful.
    page.set_viewport_size(PHONE)
    open_template(console, template_id, "six")
    console.shot("second-editor-six-390")
    phone_tall = height(page.locator("main form").first)
    assert height(page.get_by_label("Input schema (JSON Schema)")) <= height(page.get_by_label("Step id").first) + 8
    print(f"editor of six steps: {tall:.0f} px at 1280, {phone_tall:.0f} px at 390")
    assert tall < 4300, tall  # 7,103 px before: an empty 18-line box per schema, a row per field
    assert phone_tall < 6800, phone_tall  # 9,584 px before
    assert page.evaluate(OVERFLOWING) == []
    assert console.errors == []


def test_run_output_is_a_text_area_sized_to_its_text(console: Console, fake):
    page = console.page
    _, _, template_id = editor_of_six(console, fake)
    open_template(console, template_id, "six")
    output = page.get_by_label("Run output")
    assert output.evaluate("(e) => e.tagName") == "TEXTAREA"
    empty = height(output)
    # a multi-line field even while empty (issue 39: one line read as a one-line field)
    from tests.console.test_console_third_pass import LINES_SHOWN
    assert output.evaluate(LINES_SHOWN) >= 2.9
    output.fill("{\n  'text': steps.publish.output,\n  'plan': steps.plan.output,\n  'ask': steps.ask.output,\n"
                "  'draft': steps.draft.output\n}")
    assert output.evaluate("(t) => t.scrollHeight <= t.clientHeight + 2")  # all of it shown
    assert height(output) > 1.5 * empty
    console.shot("second-run-output-1280")
    page.set_viewport_size(PHONE)
    output.fill("steps.publish.output + ' and a much longer expression that wraps on a phone ' + steps.plan.output")
    page.wait_for_timeout(100)
    assert output.evaluate("(t) => t.scrollHeight <= t.clientHeight + 2")  # the wrapped lines too
    console.shot("second-run-output-390")
    assert console.errors == []


def test_number_fields_look_like_text_fields(console: Console, fake):
    page = console.page
    _, _, template_id = editor_of_six(console, fake)
    open_template(console, template_id, "six")
    styles = """(e) => { const s = getComputedStyle(e);
      return [s.backgroundColor, s.borderTopColor, s.borderTopWidth, s.borderRadius, s.paddingLeft, s.paddingTop, s.width]; }"""
    for width in (DESKTOP, PHONE):
        page.set_viewport_size(width)
        text_field = step(page, 0).get_by_label("Step id")
        for label in ("Timeout (seconds)", "Attempts"):
            number = step(page, 0).get_by_label(label)
            assert number.get_attribute("type") == "number"
            text_style, number_style = text_field.evaluate(styles), number.evaluate(styles)
            assert number_style[:6] == text_style[:6], (label, number_style, text_style)
            assert abs(float(number_style[6][:-2]) - float(text_style[6][:-2])) < 2  # both as wide as their column
        console.shot(f"second-number-fields-{width['width']}")
    assert console.errors == []


def test_help_text_never_breaks_inside_a_word_on_a_phone(console: Console, fake):
    page = console.page
    http, worker, template_id = editor_of_six(console, fake)
    page.set_viewport_size(PHONE)
    open_template(console, template_id, "six")
    assert page.evaluate(MID_WORD_BREAKS, ".hint, .problem") == []
    # The Runs page's JSON input names its schema, broken between words only.
    topics = http.post("/workflow/template", json={
        "name": "topics", "input_schema": {"type": "object", "required": ["topics"], "properties": {
            # a long stretch with no place to break in compact JSON: `"type":"array","minItems":1,…`
            "topics": {"type": "array", "minItems": 1, "maxItems": 12, "uniqueItems": True, "additionalItems": False,
                       "items": {"type": "string", "maxLength": 80}},
            "audience": {"type": "string"}}},
        "steps": [{"id": "each", "foreach": {"items": "input.topics"}, "agent": {"worker": worker}, "prompt": "{{item}}"}]})
    assert topics.status_code == 201, topics.text
    console.open(f"runs?template={topics.json()['template_id']}")
    page.locator("form .hint").filter(has_text="maxItems").wait_for()
    console.shot("second-runs-schema-hint-390")
    assert page.evaluate(MID_WORD_BREAKS, ".hint, .hint code") == []
    page.set_viewport_size(DESKTOP)
    console.shot("second-runs-schema-hint-1280")
    assert console.errors == []


def test_inner_steps_are_edited_with_the_step_form(console: Console, fake):
    page = console.page
    page.set_viewport_size(DESKTOP)
    http = api(console)
    make_worker(http, fake.base_url, "helper")
    make_worker(http, fake.base_url, "researcher")
    console.sign_in("root")
    console.open("templates/new")
    page.get_by_role("heading", name="New template").wait_for()
    page.get_by_label("Name", exact=True).fill("nested")
    page.get_by_text("Input, limits and output").click()
    page.get_by_label("Input schema (JSON Schema)").fill(json.dumps(
        {"type": "object", "properties": {"topics": {"type": "array", "items": {"type": "string"}}}}))
    first = step(page, 0)
    first.get_by_label("Step id").fill("each")
    first.get_by_label("Runs").select_option("foreach")
    first.get_by_label("Items").fill("input.topics")
    first.get_by_label("Per item").select_option("steps")
    # The item's workflow: a step form, its worker chosen by name.
    inner = first.locator(".inner-editor")
    expect(first.get_by_label("Steps of each item (JSON)")).to_have_count(0)  # no JSON to write
    fetch = inner_step(first, 0)
    fetch.get_by_label("Step id").fill("fetch")
    worker_select = fetch.get_by_label("Worker")
    names = worker_select.locator("option").all_inner_texts()
    assert "researcher" in names and "helper" in names, names
    worker_select.select_option(label="researcher")
    fetch.get_by_label("Prompt").fill("Find {{item}}")
    inner.get_by_role("button", name="Add an inner step").click()
    facts = inner_step(first, 1)
    facts.get_by_label("Step id").fill("facts")
    expect(facts.get_by_role("checkbox", name="fetch")).to_be_checked()
    facts.get_by_label("Worker").select_option(label="researcher")
    facts.get_by_label("Prompt").fill("Facts of {{steps.nope.output}}")
    first.get_by_label("Item output").fill("steps.facts.output")
    # A loop after it, its iteration's one step also a form.
    page.get_by_role("button", name="Add a step", exact=True).click()
    second = step(page, 1)
    second.get_by_label("Step id").fill("improve")
    second.get_by_label("Runs").select_option("loop")
    second.get_by_label("Max iterations").fill("2")
    second.get_by_label("Until").fill("false")
    polish = inner_step(second, 0)
    polish.get_by_label("Step id").fill("polish")
    polish.get_by_label("Worker").select_option(label="researcher")
    polish.get_by_label("Prompt").fill("Polish {{ loop.iteration }}")
    console.shot("second-inner-form-1280")

    # The server's 422 inside the item's workflow is shown at that inner step's field.
    page.get_by_role("button", name="Save template").click()
    facts.locator(".field").filter(has=page.get_by_label("Prompt")).locator(".problem").get_by_text("nope").wait_for()
    assert http.get("/workflow/template").json()["templates"] == []
    facts.get_by_label("Prompt").fill("Facts of {{steps.fetch.output}}")
    # A rename inside carries the references of its siblings along.
    fetch.get_by_label("Step id").fill("find")
    expect(facts.get_by_label("Prompt")).to_have_value("Facts of {{steps.find.output}}")
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'nested' created.").wait_for()
    (stored,) = http.get("/workflow/template").json()["templates"]
    each, improve = stored["steps"]
    assert each["foreach"]["items"] == "input.topics" and each["output"] == "steps.facts.output"
    assert [(s["id"], s["agent"], s["prompt"], s.get("depends_on", [])) for s in each["steps"]] == [
        ("find", {"worker": "researcher"}, "Find {{item}}", []),
        ("facts", {"worker": "researcher"}, "Facts of {{steps.find.output}}", ["find"])]
    assert "agent" not in each and "agent" not in improve
    assert improve["loop"]["max_iterations"] == 2 and improve["depends_on"] == ["each"]
    assert [(s["id"], s["agent"], s["prompt"]) for s in improve["loop"]["steps"]] == [
        ("polish", {"worker": "researcher"}, "Polish {{ loop.iteration }}")]

    # Opened again, the inner steps show the worker by name, and the graph draws them.
    page.reload()
    page.get_by_role("heading", name="Template nested").wait_for()
    polish = inner_step(step(page, 1), 0)
    assert polish.get_by_label("Worker").evaluate("(s) => s.options[s.selectedIndex].text") == "researcher"
    # Every select shows a choice (the server's own defaults, `on_error: "fail"`, included).
    blank = page.locator("main select").evaluate_all("(all) => all.filter((s) => s.selectedIndex < 0).map((s) => s.id)")
    assert blank == []
    expect(page.locator('figure.graph g.node.container[data-step="each"] g.node[data-step="facts"]')).to_have_count(1)
    console.shot("second-inner-saved-1280")
    page.set_viewport_size(PHONE)
    page.reload()
    page.get_by_role("heading", name="Template nested").wait_for()
    assert page.evaluate(OVERFLOWING) == []
    console.shot("second-inner-saved-390")
    assert console.errors == []


def a_finished_map(console: Console, fake) -> tuple[str, str]:
    """A run of a foreach over three topics, a step skipped by its `when`, a loop stopped by
    its max_iterations and a last step, finished; root signed in. (template id, trace id)"""
    console.page.set_viewport_size(DESKTOP)
    http = api(console)
    worker = make_worker(http, fake.base_url)
    made = http.post("/workflow/template", json={
        "name": "map", "input_schema": {"type": "object", "properties": {"topics": {"type": "array"}}},
        "steps": [
            {"id": "research", "foreach": {"items": "input.topics"}, "agent": {"worker": worker},
             "prompt": "About {{ item.topic }}"},
            {"id": "never", "agent": {"worker": worker}, "prompt": "x", "depends_on": ["research"], "when": "false"},
            {"id": "improve", "depends_on": ["research"], "loop": {
                "steps": [{"id": "polish", "agent": {"worker": worker}, "prompt": "Polish {{ loop.iteration }}"}],
                "until": "false", "max_iterations": 2}},
            {"id": "report", "agent": {"worker": worker}, "prompt": "{{steps.improve.output}}",
             "depends_on": ["improve", "never"]}]})
    assert made.status_code == 201, made.text
    topics = [{"topic": "tea"}, {"topic": "coffee", "origin": "Ethiopia"}, {"topic": "a rather long topic " * 4}]
    trace_id = http.post("/workflow/run", json={"template_id": made.json()["template_id"],
                                               "input": {"topics": topics}}).json()["trace_id"]
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    expect(console.page.locator("section.run")).to_have_attribute("data-status", "succeeded", timeout=60_000)
    return made.json()["template_id"], trace_id


def test_foreach_items_are_named_by_their_value(console: Console, fake):
    page = console.page
    a_finished_map(console, fake)
    group = page.locator('.instances[data-container="research"]')
    expect(group.locator('li.instance[data-path="research[0]"] .instance-name')).to_have_text("tea")
    expect(group.locator('li.instance[data-path="research[1]"] .instance-name')).to_have_text("coffee")
    long_name = group.locator('li.instance[data-path="research[2]"] .instance-name').inner_text()
    assert long_name.startswith("a rather long topic") and len(long_name) <= 40, long_name
    expect(group.locator('li.instance[data-path="research[1]"] .instance-index')).to_have_text("#1")
    expect(page.locator("li.instance[data-path='improve#1'] .instance-name").first).to_have_text("iteration 1")
    console.shot("second-run-items-1280")
    page.set_viewport_size(PHONE)
    assert page.evaluate(OVERFLOWING) == []
    console.shot("second-run-items-390")
    assert console.errors == []


def test_skipped_and_max_iterations_notes_are_neutral(console: Console, fake):
    page = console.page
    a_finished_map(console, fake)
    ok = page.evaluate(COLOUR_OF, "var(--ok)")
    muted = page.evaluate(COLOUR_OF, "var(--muted)")
    skipped = page.locator('article[data-step="never"] p').filter(has_text="Skipped: its condition was false.")
    stopped = page.locator('article[data-step="improve"] p').filter(has_text="Stopped after 2 iterations")
    for width in (DESKTOP, PHONE):
        page.set_viewport_size(width)
        for note in (skipped, stopped):
            colours = note.evaluate("(e) => { const s = getComputedStyle(e); return [s.borderLeftColor, s.color]; }")
            assert ok not in colours, (colours, ok)
            assert colours[0] == muted, (colours, muted)
        console.shot(f"second-notes-{width['width']}")
    assert console.errors == []


def test_on_a_phone_the_graph_reads_and_the_navigation_is_a_menu(console: Console, fake):
    page = console.page
    template_id, trace_id = a_finished_map(console, fake)
    page.set_viewport_size(PHONE)
    page.reload()
    page.locator('figure.graph g.node[data-step="report"]').wait_for()
    console.shot("second-run-graph-390")
    assert page.evaluate(SMALLEST_GRAPH_TEXT) >= 11
    assert page.evaluate(OVERFLOWING) == []
    header = page.locator("header.top")
    assert height(header) <= 60, height(header)  # one line
    links = page.locator("header.top nav a")
    expect(links.first).to_be_hidden()
    menu = page.get_by_role("button", name="Menu")
    expect(menu).to_have_attribute("aria-expanded", "false")
    menu.click()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_role("link", name="Templates")).to_be_visible()
    page.keyboard.press("Escape")  # closes it, back on the button
    expect(links.first).to_be_hidden()
    expect(menu).to_be_focused()
    menu.click()
    console.shot("second-menu-open-390")
    page.get_by_role("link", name="Templates").click()
    page.get_by_role("heading", name="Templates").wait_for()
    expect(links.first).to_be_hidden()  # the menu closes on a navigation
    open_template(console, template_id, "map")
    page.locator('figure.graph g.node[data-step="report"]').wait_for()
    assert page.evaluate(SMALLEST_GRAPH_TEXT) >= 11
    console.shot("second-template-graph-390")
    # Turned to a wide screen: the navigation itself, no menu; the graph left to right.
    page.set_viewport_size(DESKTOP)
    expect(links.first).to_be_visible()
    expect(page.get_by_role("button", name="Menu")).to_be_hidden()
    assert page.evaluate(SMALLEST_GRAPH_TEXT) >= 11
    console.shot("second-template-graph-1280")
    assert console.errors == []


def test_a_run_resumed_while_its_question_is_open_shows_waiting_reply(console: Console):
    page = console.page
    page.set_viewport_size(DESKTOP)
    http = api(console)
    made = http.post("/workflow/template", json={"name": "ask", "steps": [
        {"id": "ask", "agent": {"human": True}, "prompt": "Still with me?"}]})
    trace_id = http.post("/workflow/run", json={"template_id": made.json()["template_id"]}).json()["trace_id"]
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    page.get_by_text("ask asks: Still with me?").wait_for()
    console.server.kill()
    page.locator(".connection.reconnecting").wait_for()
    console.server.start()
    page.locator(".notice.resumed").wait_for(timeout=60_000)
    run = api(console).get(f"/workflow/run/{trace_id}").json()
    assert run["status"] == "waiting_reply" and [q["step_id"] for q in run["pending_replies"]] == ["ask"]
    for width in (DESKTOP, PHONE):
        page.set_viewport_size(width)
        expect(page.locator("section.run")).to_have_attribute("data-status", "waiting_reply")
        expect(page.locator("section.run h1 .badge")).to_have_text("waiting_reply")
        expect(page.locator('article[data-step="ask"] .badge')).to_have_text("waiting_reply")
        expect(page.locator("form.reply")).to_have_count(1)
        console.shot(f"second-resumed-waiting-{width['width']}")
    # Opened afresh, the replay of the same events says the same.
    page.reload()
    page.locator(".notice.resumed").wait_for()
    expect(page.locator("section.run")).to_have_attribute("data-status", "waiting_reply")
    expect(page.locator('figure.graph g.node.status-waiting_reply[data-step="ask"]')).to_have_count(1)
    page.get_by_label("Your reply").fill("yes")
    page.get_by_role("button", name="Send reply").click()
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded")
    assert console.errors == []
