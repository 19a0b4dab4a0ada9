"""The console in Chromium against a real server and the fake LLM: register and sign in,
add providers and a worker, a template with a human step (and one with a cycle, refused at
its steps), start a run, watch tokens stream, answer the question, see the output; a
super administrator changes a role; and a server killed mid-run, restarted, with the view
reconnecting and showing what follows without a gap or a duplicated word."""

from __future__ import annotations

import json
import re

import httpx
from playwright.sync_api import expect

from tests.console.conftest import PASSWORD, Console, start_server

SUMMARY = "Confirmed: six times seven is forty-two, as the user agreed on reflection."


def api_login(console: Console, user_name: str) -> httpx.Client:
    token = httpx.post(f"{console.server.base_url}/api/v1/auth/login",
                       json={"user_name": user_name, "password": PASSWORD}).json()["access_token"]
    return httpx.Client(base_url=console.server.base_url + "/api/v1",
                        headers={"Authorization": f"Bearer {token}"}, timeout=15)


def step_text(page, step_id: str) -> str:
    stream = page.locator(f'article[data-step="{step_id}"] pre.stream')
    return stream.inner_text() if stream.count() else ""


def assert_only_local_requests(console: Console) -> None:
    foreign = [url for url in console.requested if not url.startswith(console.server.base_url + "/")]
    assert foreign == []
    assert console.errors == [], console.errors


def register_and_sign_in(console: Console) -> None:
    page = console.page
    console.open()
    page.get_by_role("heading", name="Sign in to orchestra").wait_for()
    console.shot("01-sign-in")
    page.get_by_role("link", name="Register").click()
    page.get_by_label("User name").fill("alice")
    page.get_by_text("8 to 256 characters").wait_for()  # the minimum is said before any refusal
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Repeat the password").fill(PASSWORD + "x")
    page.get_by_role("button", name="Register").click()
    page.get_by_text("The two passwords differ").wait_for()  # a typo is caught before sending
    page.get_by_label("Password", exact=True).fill("short")
    page.get_by_label("Repeat the password").fill("short")
    page.get_by_role("button", name="Register").click()
    # The API's 422 problem, next to the field it names.
    page.locator(".field.invalid").filter(has_text="Password").locator(".problem").get_by_text("8 to 256").wait_for()
    console.shot("02-register-refused")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Repeat the password").fill(PASSWORD)
    page.get_by_role("button", name="Register").click()
    page.get_by_role("heading", name="Runs", exact=True).wait_for()
    assert page.locator(".who").inner_text().startswith("alice")
    assert page.get_by_role("link", name="Providers").count() == 0  # a USER's navigation
    page.get_by_role("button", name="Sign out").click()
    page.get_by_text("You signed out.").wait_for()
    page.get_by_label("Password").fill("wrong-password")
    page.get_by_label("User name").fill("alice")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("alert").filter(has_text=re.compile("password", re.IGNORECASE)).wait_for()
    console.sign_in("root")


def add_providers(console: Console, fake_url: str) -> None:
    page = console.page
    page.get_by_role("link", name="Providers").click()
    page.get_by_role("heading", name="Providers", exact=True).wait_for()
    for name, key in [("fake", "good-key"), ("broken", "bad-key")]:
        page.get_by_label("Name").fill(name)
        page.get_by_label("Kind").select_option("openai_compatible")
        page.get_by_label("Model id").fill("fake-model")
        page.get_by_label("Base URL").fill(fake_url)
        page.get_by_label("API key").fill(key)
        page.get_by_role("button", name="Add provider").click()
        page.locator(f'tr[data-provider="{name}"]').wait_for()
    page.locator('tr[data-provider="fake"]').get_by_role("button", name="Check").click()
    page.get_by_text("Works: 2 models (fake-model, fake-model-large).").wait_for()
    page.locator('tr[data-provider="broken"]').get_by_role("button", name="Check").click()
    # our own sentence, never the provider's body (SPEC §3: check echoes nothing it was answered)
    page.get_by_role("alert").filter(has_text="Provider 'broken' refused the API key (HTTP 401); check the key.").wait_for()
    console.shot("03-providers")


def create_worker(console: Console) -> None:
    page = console.page
    page.get_by_role("link", name="Workers").click()
    page.get_by_role("heading", name="New worker").wait_for()
    # Administrators also manage skills and the system nodes here.
    page.get_by_label("Skill name").fill("terse")
    page.get_by_label("Instructions").fill("Answer in one line.")
    page.get_by_role("button", name="Add skill").click()
    page.get_by_text("Skill 'terse' added.").wait_for()
    page.get_by_label("Provider of planner").select_option(label="fake")
    page.get_by_role("button", name="Save planner").click()
    page.get_by_text("System node 'planner' saved.").wait_for()
    page.get_by_label("Name", exact=True).fill("calc")
    page.get_by_label("Provider", exact=True).select_option(label="fake (openai_compatible, fake-model)")
    page.get_by_label("Skill", exact=True).select_option("terse")
    page.get_by_role("checkbox", name=re.compile("^calculator")).check()
    page.get_by_role("button", name="Create worker").click()
    row = page.locator('tr[data-worker="calc"]')
    expect(row).to_contain_text("calculator")
    expect(row).to_contain_text("terse")
    row.get_by_role("button", name="Edit").click()
    page.get_by_label("Model", exact=True).fill("fake-model-large")
    page.get_by_role("button", name="Save worker").click()
    page.get_by_text("Worker 'calc' saved.").wait_for()
    expect(row).to_contain_text("fake-model-large")
    http = api_login(console, "root")
    (worker,) = http.get("/agent/worker").json()["workers"]
    assert (worker["tools"], worker["bound_skill"], worker["model"]) == (["calculator"], "terse", "fake-model-large")
    planner = http.get("/agent/node/planner").json()
    assert planner["provider_name"] == "fake"
    console.shot("04-workers")
    # The provider now cannot be deleted: the page names the worker and node that block it.
    page.get_by_role("link", name="Providers").click()
    row = page.locator('tr[data-provider="fake"]')
    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Delete fake").click()
    page.locator("ul.blockers").get_by_text("calc").wait_for()
    page.locator("ul.blockers").get_by_text("planner").wait_for()


def step(page, index: int):
    return page.locator(f'fieldset[data-step-index="{index}"]')


def refuse_a_cycle(console: Console) -> None:
    page = console.page
    page.get_by_role("link", name="Templates").click()
    page.get_by_role("link", name="New template").click()
    page.get_by_label("Name", exact=True).fill("loop")
    step(page, 0).get_by_label("Step id").fill("a")
    page.get_by_role("button", name="Add a step").click()
    step(page, 1).get_by_label("Step id").fill("b")  # depends on a, by default
    step(page, 0).get_by_role("checkbox", name="b").check()  # and a on b: a cycle
    page.get_by_role("button", name="Save template").click()
    for index in (0, 1):
        step(page, index).locator(".problem").filter(has_text="cycle").wait_for()
    assert page.locator("figure.graph g.node.flagged").count() == 2
    console.shot("05-template-cycle-refused")
    # The same template as JSON: break the cycle there, come back, save, then edit it.
    page.get_by_role("button", name="JSON").click()
    editor = page.get_by_label("Template as JSON")
    body = json.loads(editor.input_value())
    assert [(s["id"], s["depends_on"]) for s in body["steps"]] == [("a", ["b"]), ("b", ["a"])]
    body["steps"][0]["depends_on"] = []
    editor.fill(json.dumps(body))
    page.get_by_role("button", name="Step editor").click()
    assert not step(page, 0).get_by_role("checkbox", name="b").is_checked()
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'loop' created.").wait_for()
    page.wait_for_url(re.compile(r"#/templates/[0-9a-f-]{36}$"))
    template_id = page.url.rsplit("/", 1)[1]
    page.get_by_label("Description").fill("two questions")
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'loop' saved.").wait_for()
    saved = api_login(console, "root").get(f"/workflow/template/{template_id}").json()["template"]
    assert saved["description"] == "two questions"
    assert [(s["id"], s["depends_on"]) for s in saved["steps"]] == [("a", []), ("b", ["a"])]


def create_template(console: Console) -> str:
    page = console.page
    page.get_by_role("link", name="Templates").click()
    page.get_by_role("link", name="New template").click()
    page.get_by_label("Name", exact=True).fill("ask and sum")
    # Each new step depends on the one before it and is a worker's (the editor's defaults).
    plan = [("calc", "calc", "Compute {{input}}"),
            ("ask", "human", "Is {{steps.calc.output}} right?"),
            ("final", "calc", "Summarise {{steps.calc.output}} given {{steps.ask.output}}")]
    for index, (step_id, worker, prompt) in enumerate(plan):
        if index:
            page.get_by_role("button", name="Add a step").click()
        editor = step(page, index)
        editor.get_by_label("Step id").fill(step_id)
        if worker == "human":
            editor.get_by_label("Agent").select_option("human")
        else:
            expect(editor.get_by_label("Agent")).to_have_value("worker")
            editor.get_by_label("Worker").select_option(label=worker)
        editor.get_by_label("Prompt").fill(prompt)
    page.get_by_role("button", name="Save template").click()
    page.get_by_text("Template 'ask and sum' created.").wait_for()
    page.wait_for_url(re.compile(r"#/templates/[0-9a-f-]{36}$"))
    expect(page.locator("figure.graph path.edge")).to_have_count(2)  # calc → ask → final (once drawn)
    console.shot("06-template")
    return page.url.rsplit("/", 1)[1]


def run_it(console: Console, fake) -> str:
    page = console.page
    fake.script_tool_call("calculator", {"expression": "6*7"})
    fake.script_text("The answer is 42.", chunks=5, delay=0.05)
    fake.script_text(SUMMARY, chunks=25, delay=0.12)
    page.get_by_role("link", name="Run it").click()
    page.get_by_label("Input").fill("6*7")
    page.get_by_label("Files").set_input_files(files=[{"name": "notes.txt", "mimeType": "text/plain",
                                                       "buffer": b"six sevens" * 1000}])
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url(re.compile(r"#/run/[0-9a-f-]+$"))
    trace_id = page.url.rsplit("/", 1)[1]
    calc = page.locator('article[data-step="calc"]')
    calc.get_by_text("← 42").wait_for()
    calc.get_by_text('→ calculator({"expression":"6*7"})').wait_for()
    page.get_by_text("ask asks:").wait_for()
    assert page.locator("section.run").get_attribute("data-status") == "waiting_reply"
    console.shot("07-run-question")
    page.get_by_label("Your reply").fill("yes")
    page.get_by_role("button", name="Send reply").click()
    # Tokens arrive while the step runs: the text grows before the step is done.
    page.wait_for_function(
        """() => { const card = document.querySelector('article[data-step="final"]');
                   const text = card && card.querySelector('pre.stream');
                   return text && text.textContent.length > 0 && card.classList.contains('status-running'); }""")
    partial = step_text(page, "final")
    assert SUMMARY.startswith(partial) and len(partial) < len(SUMMARY)
    console.shot("08-run-streaming")
    page.locator('section.run[data-status="succeeded"]').wait_for()
    assert step_text(page, "final") == SUMMARY  # every token once
    assert page.locator(".final-output").inner_text() == SUMMARY
    assert page.locator('article[data-step="ask"] .answer').inner_text() == "Answer: yes"
    # A human step's question is stored once (in reply_requested): its card still shows it.
    assert page.locator('article[data-step="ask"] details pre').text_content().endswith(" right?")
    assert re.search(r"Tokens: \d+ prompt · \d+ completion · \d+ total", page.locator(".outcome .usage").inner_text())
    log = page.locator("ol.event-log")
    assert log.get_attribute("data-count") == log.get_attribute("data-last")  # no gap, no repeat
    assert page.locator(".connection").inner_text() == "ended"
    console.shot("09-run-succeeded")
    run = api_login(console, "root").get(f"/workflow/run/{trace_id}").json()
    assert run["status"] == "succeeded" and len(run["files"]) == 1  # the file went up with the run
    return trace_id


def see_it_listed_and_replayed(console: Console, trace_id: str) -> None:
    page = console.page
    page.get_by_role("link", name="Runs").click()
    page.get_by_label("Status").select_option("succeeded")
    row = page.locator(f'tr[data-run="{trace_id}"]')
    row.wait_for()
    assert "succeeded" in row.inner_text()
    page.get_by_label("Status").select_option("failed")
    row.wait_for(state="detached")
    page.get_by_label("Status").select_option("")
    console.shot("10-runs")
    row.get_by_role("link").click()
    page.locator('section.run[data-status="succeeded"]').wait_for()
    assert page.locator(".connection").inner_text() == "replay · ended"
    assert step_text(page, "final") == SUMMARY


def change_a_role(console: Console) -> None:
    page = console.page
    page.get_by_role("link", name="Users").click()
    alice = page.locator('tr[data-user="alice"]')
    alice.get_by_label("Role of alice").select_option("ADMINISTRATOR")
    alice.get_by_role("button", name="Save role").click()
    page.get_by_text("alice is now ADMINISTRATOR.").wait_for()
    http = api_login(console, "root")
    roles = {u["user_name"]: u["role"] for u in http.get("/auth/list").json()["users"]}
    assert roles == {"root": "SUPER_ADMINISTRATOR", "alice": "ADMINISTRATOR"}
    # The last super administrator cannot step down: the API's own words, at the row.
    root_id = next(u["user_id"] for u in http.get("/auth/list").json()["users"] if u["user_name"] == "root")
    refused = http.put("/auth/authority", json={"user_id": root_id, "new_authority": "USER"})
    assert refused.status_code == 409
    row = page.locator('tr[data-user="root"]')
    row.get_by_label("Role of root").select_option("USER")
    row.get_by_role("button", name="Save role").click()
    page.get_by_role("alert").filter(has_text=refused.json()["message"]).wait_for()
    console.shot("11-users")


def test_the_console_end_to_end(console: Console, fake):
    register_and_sign_in(console)
    add_providers(console, fake.base_url)
    create_worker(console)
    refuse_a_cycle(console)
    create_template(console)
    trace_id = run_it(console, fake)
    see_it_listed_and_replayed(console, trace_id)
    change_a_role(console)
    assert_only_local_requests(console)


def test_narrow_screen_dark_scheme_and_keyboard(chromium, served, screenshots, fake):
    """At 360 px nothing scrolls sideways (tables scroll in their own box); the system's dark
    preference gives the dark palette; the sign-in form works by keyboard alone."""
    console = Console(chromium, served, screenshots, width=360, height=740, color_scheme="dark")
    try:
        page = console.page
        console.open()
        page.keyboard.press("Tab")  # the skip link
        page.keyboard.press("Tab")
        page.keyboard.type("root")
        page.keyboard.press("Tab")
        page.keyboard.type(PASSWORD)
        page.keyboard.press("Enter")
        page.get_by_role("button", name="Sign out").wait_for()
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        red, green, blue = map(int, re.findall(r"\d+", background)[:3])
        assert red + green + blue < 150, background  # dark
        for fragment in ["runs", "templates/new", "workers", "providers", "users"]:
            console.open(fragment)
            page.locator("main h1").first.wait_for()
            page.wait_for_load_state("networkidle")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 360, (fragment, width)
            console.shot(f"narrow-dark-{fragment.replace('/', '-')}")
        assert_only_local_requests(console)
    finally:
        console.close()


def test_tokens_are_refreshed_before_they_expire(chromium, tmp_path, screenshots):
    """With 6-second access tokens the page swaps its pair before expiry and keeps working
    long after the first token died."""
    server = start_server(tmp_path / "home", env={"ORCHESTRA_ACCESS_TTL": "6"})
    console = Console(chromium, server, screenshots)
    try:
        console.sign_in("root")
        page = console.page
        read = "() => JSON.parse(sessionStorage.getItem('orchestra.session')).access_token"
        first = page.evaluate(read)
        page.wait_for_function(  # a function, not a string: the page's CSP forbids eval
            "(first) => JSON.parse(sessionStorage.getItem('orchestra.session')).access_token !== first",
            arg=first, timeout=10_000)
        page.wait_for_timeout(7_000)  # the first token is now expired
        expired = httpx.get(f"{server.base_url}/api/v1/auth/list", headers={"Authorization": f"Bearer {first}"})
        assert expired.status_code == 401 and expired.json()["error"] == "TokenExpiredError"
        page.get_by_role("link", name="Users").click()
        page.locator('tr[data-user="root"]').wait_for()
        assert page.get_by_role("button", name="Sign out").is_visible()
        assert console.errors == []
    finally:
        console.close()
        server.stop()


def test_rate_limit_is_shown_with_when_to_retry(chromium, tmp_path, screenshots):
    server = start_server(tmp_path / "home", env={"ORCHESTRA_RATE_LIMIT_LOGIN": "2/minute"})
    console = Console(chromium, server, screenshots)
    try:
        page = console.page
        console.open("login")
        page.get_by_label("User name").fill("root")
        page.get_by_label("Password").fill("not-the-password")
        for _ in range(3):
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("alert").wait_for()
        alert = page.get_by_role("alert").filter(has_text=re.compile(r"Try again in \d+ s\."))
        alert.wait_for()
        shown = re.fullmatch(r"Too many login attempts; try again in (\d+) seconds\. Try again in \1 s\.",
                             alert.inner_text())
        assert shown, alert.inner_text()
        refused = httpx.post(f"{server.base_url}/api/v1/auth/login",
                             json={"user_name": "root", "password": PASSWORD})
        # The API's own words, asked a moment after the page was: at most a second or two fewer.
        assert refused.status_code == 429
        told = re.fullmatch(r"Too many login attempts; try again in (\d+) seconds\.", refused.json()["message"])
        assert told and 0 <= int(shown[1]) - int(told[1]) <= 2, (shown[0], refused.json())
        assert int(refused.headers["Retry-After"]) == int(told[1])
        console.shot("14-rate-limited")
    finally:
        console.close()
        server.stop()


def stored_text(http: httpx.Client, trace_id: str, step_id: str) -> tuple[str, int]:
    """The step's text as the store has it (tokens after its last start), and the last seq."""
    events = http.get(f"/workflow/run/{trace_id}/events").json()["events"]
    text = ""
    for event in events:
        if event["data"].get("step_id") != step_id:
            continue
        if event["kind"] == "step_started":
            text = ""
        elif event["kind"] == "token":
            text += event["data"]["text"]
    return text, events[-1]["seq"]


def test_the_run_view_survives_a_server_restart(console: Console, fake):
    """kill -9 mid-stream, start again on the same port: the view reconnects, shows how the
    run went on (interrupted, or resumed by the engine) and holds each word once."""
    http = api_login(console, "root")
    provider = http.post("/provider", json={"name": "fake", "provider": "openai_compatible",
                                            "model_id": "fake-model", "base_url": fake.base_url})
    worker = http.post("/agent/worker", json={"name": "slow", "provider_id": provider.json()["provider_id"]})
    steps = [{"id": "slow", "agent": {"worker": worker.json()["worker_id"]}, "prompt": "Tell {{input}}"}]
    template = http.post("/workflow/template", json={"name": "slow", "steps": steps}).json()["template_id"]
    words = " ".join(f"word{i}" for i in range(60))
    fake.script_text(words, chunks=60, delay=0.1)
    trace_id = http.post("/workflow/run", json={"template_id": template, "input": "a story"}).json()["trace_id"]

    console.sign_in("root")
    console.open(f"run/{trace_id}")
    page = console.page
    page.wait_for_function("""() => { const t = document.querySelector('article[data-step="slow"] pre.stream');
                                      return t && t.textContent.length > 20; }""")
    console.server.kill()
    page.locator(".connection.reconnecting").wait_for()
    console.shot("12-restart-reconnecting")
    console.server.start()

    page.wait_for_function("""() => ['interrupted', 'succeeded', 'failed']
                                    .includes(document.querySelector('section.run').dataset.status)""",
                           timeout=60_000)
    status = page.locator("section.run").get_attribute("data-status")
    http = api_login(console, "root")
    run = http.get(f"/workflow/run/{trace_id}").json()
    assert status == run["status"] and status in {"interrupted", "succeeded"}
    expected, last_seq = stored_text(http, trace_id, "slow")
    shown = step_text(page, "slow")
    assert shown == expected  # no gap, no word twice
    if status == "interrupted":
        assert len(shown) > 20 and words.startswith(shown)  # what streamed before the kill
    else:  # resumed: the step ran again from its start, and the page began its text again
        assert shown == run["steps"][0]["output"] and not shown.startswith("word0")
        assert page.locator(".notice.resumed").count() == 1
        assert page.locator('article[data-step="slow"]').get_by_text("run 2 times").count() == 1
    log = page.locator("ol.event-log")
    assert log.get_attribute("data-count") == log.get_attribute("data-last") == str(last_seq)
    assert page.locator(".connection").inner_text() == "ended"
    console.shot("13-restart-after")
    foreign = [u for u in console.requested if not u.startswith(console.server.base_url + "/")]
    assert foreign == []


def watch_a_question(console: Console, http: httpx.Client, step_id: str, prompt: str) -> str:
    """Start a one-step run that asks `prompt`, open its view as root, wait for the question."""
    steps = [{"id": step_id, "agent": {"human": True}, "prompt": prompt}]
    template = http.post("/workflow/template", json={"name": step_id, "steps": steps}).json()["template_id"]
    trace_id = http.post("/workflow/run", json={"template_id": template}).json()["trace_id"]
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    console.page.get_by_text(f"{step_id} asks: {prompt}").wait_for()
    return trace_id


def test_a_waiting_run_is_cancelled_from_its_view(console: Console):
    http = api_login(console, "root")
    trace_id = watch_a_question(console, http, "wait", "Shall we go on?")
    page = console.page
    page.get_by_role("button", name="Cancel run").click()
    page.locator('section.run[data-status="cancelled"]').wait_for()
    assert page.get_by_label("Your reply").count() == 0  # no question left to answer
    assert page.locator('article[data-step="wait"]').get_attribute("class").endswith("status-cancelled")
    assert http.get(f"/workflow/run/{trace_id}").json()["status"] == "cancelled"
    assert page.get_by_role("button", name="Cancel run").count() == 0


def test_a_question_open_when_the_server_died_is_asked_once_after_restart(console: Console):
    """The run waits for a reply when its server is killed. After the restart the page
    shows how it went on: interrupted (no reply box), or resumed with the question still
    open (kept, or asked again if the step restarted) — one reply box, not two — which the
    page then answers."""
    watch_a_question(console, api_login(console, "root"), "ask", "Still with me?")
    page = console.page
    console.server.kill()
    page.locator(".connection.reconnecting").wait_for()
    console.server.start()
    page.wait_for_function("""() => document.querySelector('.notice.resumed')
                                    || document.querySelector('section.run').dataset.status === 'interrupted'""",
                           timeout=60_000)
    if page.locator("section.run").get_attribute("data-status") == "interrupted":
        assert page.locator("form.reply").count() == 0
        return
    page.get_by_text("ask asks: Still with me?").wait_for()
    assert page.locator("form.reply").count() == 1
    page.get_by_label("Your reply").fill("still here")
    page.get_by_role("button", name="Send reply").click()
    page.locator('section.run[data-status="succeeded"]').wait_for()
    assert page.locator(".final-output").inner_text() == "still here"
    console.shot("15-restart-question-answered")


def test_the_stream_reopens_with_a_fresh_token_and_the_last_event_id(chromium, tmp_path, screenshots):
    """The browser's own reconnect reuses the URL, whose `?access_token=` has expired by the
    time the restarted server answers (401: the EventSource gives up). The page then
    refreshes its token, opens a new EventSource with `?last_event_id=`, and goes on."""
    server = start_server(tmp_path / "home", env={"ORCHESTRA_ACCESS_TTL": "6"})
    console = Console(chromium, server, screenshots)
    try:
        watch_a_question(console, api_login(console, "root"), "ask", "Ready?")
        page = console.page
        streams = [u for u in console.requested if "/workflow/sse/" in u]
        assert len(streams) == 1 and "last_event_id" not in streams[0]
        page.wait_for_timeout(7_000)  # the token in the stream's URL expires
        server.kill()
        page.locator(".connection.reconnecting").wait_for()
        server.start()
        page.locator(".connection.live, .connection.ended").wait_for(timeout=60_000)
        reopened = [u for u in console.requested if "/workflow/sse/" in u and "last_event_id=" in u]
        assert reopened, console.requested
        if page.locator("section.run").get_attribute("data-status") != "interrupted":
            page.get_by_label("Your reply").fill("ready")
            page.get_by_role("button", name="Send reply").click()
            page.locator('section.run[data-status="succeeded"]').wait_for()
        log = page.locator("ol.event-log")
        assert log.get_attribute("data-count") == log.get_attribute("data-last")
    finally:
        console.close()
        server.stop()
