"""The console's third first hour (issue 39, points 3, 6, 9 and 10), in Chromium against
one real server for the module and the fake LLM, with screenshots at 1280x800 and 390x844:
what started a run (the run list's *Started by*) and a schedule's fires with their
outcomes and runs; foreach items named by their value whatever the items expression;
*Run output* a multi-line field; a six-step template with one policy panel open under
3,000 px; an HTTP step's URL box wide enough for its query and its secret placeholder; the
navigation on one line at 1280 px; the usage chart's bars sorted, long names clear of
them; subscription cards with their template filter and deliveries with their errors;
the MCP page never calling a killed server reachable; the key form's templates chosen by
name."""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from collections.abc import Iterator

import httpx
import pytest

from orchestra.testing.fake_mcp import FakeMcpProcess
from tests.conftest import ServerProcess
from tests.console.conftest import PASSWORD, Console, start_server
from tests.console.test_console_first_hour import OVERFLOWING
from tests.fakes.fake_llm import FakeLLM

expect = pytest.importorskip(
    "playwright.sync_api", reason="browser tests need Playwright for Python: pip install -e '.[test]'"
).expect

pytestmark = pytest.mark.e2e

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
# How many lines of text a text area shows.
LINES_SHOWN = """(t) => { const s = getComputedStyle(t); const line = parseFloat(s.lineHeight) || parseFloat(s.fontSize) * 1.5;
  return (t.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom)) / line; }"""
LONG_NAME = "a template with a very long name that used to run over the bars of the chart"


@pytest.fixture(scope="module")
def third_server(tmp_path_factory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("third-pass"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    fake = FakeLLM()
    fake.start()
    yield fake
    fake.stop()


def api(server: ServerProcess) -> httpx.Client:
    token = httpx.post(f"{server.base_url}/api/v1/auth/login",
                       json={"user_name": "root", "password": PASSWORD}).json()["access_token"]
    return httpx.Client(base_url=server.base_url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                        timeout=30)


@pytest.fixture(scope="module")
def world(third_server, llm) -> dict:
    """A priced provider on the fake LLM, a worker, and templates: `intake` (one step),
    `pair` (two) and LONG_NAME (three)."""
    http = api(third_server)
    provider = http.post("/provider", json={
        "name": "priced", "provider": "openai_compatible", "model_id": "fake-model", "api_key": "k",
        "base_url": llm.base_url, "prices": {"input_per_mtok": 100, "output_per_mtok": 200}})
    assert provider.status_code == 201, provider.text
    worker = http.post("/agent/worker", json={"name": "researcher", "provider_id": provider.json()["provider_id"]})
    assert worker.status_code == 201, worker.text
    worker_id = worker.json()["worker_id"]
    templates = {}
    for name, count in (("intake", 1), ("pair", 2), (LONG_NAME, 3)):
        steps = [{"id": f"s{i}", "agent": {"worker": worker_id}, "prompt": f"part {i} of {{{{input}}}}",
                  "depends_on": [f"s{i - 1}"] if i else []} for i in range(count)]
        made = http.post("/workflow/template", json={"name": name, "steps": steps})
        assert made.status_code == 201, made.text
        templates[name] = made.json()["template_id"]
    return {"http": http, "worker": worker_id, "templates": templates, "server": third_server}


@pytest.fixture
def console(chromium, world, screenshots) -> Iterator[Console]:
    page = Console(chromium, world["server"], screenshots, width=DESKTOP["width"], height=DESKTOP["height"])
    page.sign_in("root")
    yield page
    page.close()


def finished(http: httpx.Client, trace_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = http.get(f"/workflow/run/{trace_id}").json()
        if run["finished_at"]:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {trace_id} did not end: {run['status']}")


def show(console: Console, fragment: str) -> None:
    """The page at `fragment`, loaded afresh (the fixture signed in on the run list)."""
    console.open(fragment)
    console.page.reload()


def both_sizes(console: Console, name: str) -> None:
    """Screenshots at 1280x800 and 390x844 (then back to 1280), nothing wider than its card on the phone."""
    page = console.page
    page.set_viewport_size(DESKTOP)
    console.shot(f"{name}-1280")
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(200)
    assert page.evaluate(OVERFLOWING) == []
    console.shot(f"{name}-390")
    page.set_viewport_size(DESKTOP)


def test_a_schedules_fires_and_the_runs_they_started(console: Console, world):
    http, server = world["http"], world["server"]
    made = http.post("/workflow/schedule", json={"template_id": world["templates"]["intake"], "cron": "* * * * *",
                                                  "catchup": "none", "overlap": "allow", "input": "tides"})
    assert made.status_code == 201, made.text
    schedule_id = made.json()["schedule_id"]
    # Its next due time 3 minutes back (in the server's store), then a save wakes the fire
    # loop: the late due times are `missed` (catchup none), the one on time starts a run.
    due = (dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=3, seconds=5)).replace(
        second=0, microsecond=0)
    with sqlite3.connect(server.home / "orchestra.db", timeout=30) as db:
        db.execute("UPDATE workflow_schedule SET next_due_at = ? WHERE id = ?", (due.isoformat(sep=" "), schedule_id))
    body = {**{k: made.json()["schedule"][k] for k in ("template_id", "cron", "timezone", "input", "overlap",
                                                        "catchup", "catchup_window_seconds", "enabled")}}
    assert http.put(f"/workflow/schedule/{schedule_id}", json=body).status_code == 200
    for _ in range(300):
        fires = http.get(f"/workflow/schedule/{schedule_id}/fires").json()["fires"]
        if len(fires) >= 3 and fires[0]["trace_id"]:
            break
        time.sleep(0.1)
    finished(http, fires[0]["trace_id"])
    assert http.put(f"/workflow/schedule/{schedule_id}", json={**body, "enabled": False}).status_code == 200
    fires = http.get(f"/workflow/schedule/{schedule_id}/fires").json()["fires"]
    trace_id = fires[0]["trace_id"]
    direct = http.post("/workflow/run", json={"template_id": world["templates"]["intake"], "input": "x"}).json()
    finished(http, direct["trace_id"])

    page = console.page
    show(console, "runs")
    scheduled = page.locator(f'tr[data-run="{trace_id}"] td[data-label="Started by"]')
    expect(scheduled).to_have_text("schedule")
    expect(scheduled.get_by_role("link", name="schedule")).to_have_attribute("href", "#/schedules")
    expect(page.locator(f'tr[data-run="{direct["trace_id"]}"] td[data-label="Started by"]')).to_have_text("direct")
    both_sizes(console, "third-runs-started-by")

    page.get_by_role("link", name="Schedules").click()
    row = page.locator(f'tr[data-schedule="{schedule_id}"]')
    row.get_by_role("button", name="Fires").click()
    history = page.locator(f'[data-fires="{schedule_id}"]')
    expect(history.locator("tbody tr")).to_have_count(len(fires))
    newest = history.locator("tbody tr").first
    expect(newest).to_have_attribute("data-outcome", "started")
    due_at = fires[0]["due_at"]  # shown readable in the schedule's zone, the exact value kept
    expect(newest.locator(f'td[data-label="Due"] time[datetime="{due_at}"]')).to_have_text(
        f"{due_at[:10]} {due_at[11:19]} {due_at[-6:]}")
    expect(newest.locator('td[data-label="Run"]')).to_contain_text(fires[0]["run_status"])
    missed = history.locator('tbody tr[data-outcome="missed"]')
    expect(missed).to_have_count(sum(f["outcome"] == "missed" for f in fires))
    expect(missed.first).to_contain_text("catchup: none")
    both_sizes(console, "third-schedule-fires")
    newest.get_by_role("link").click()
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded")
    assert trace_id in page.url
    expect(page.locator(".run-trigger")).to_have_text("started by schedule")
    assert console.errors == [], console.errors


def test_foreach_items_of_a_computed_list_are_named_by_their_value(console: Console, world):
    http = world["http"]
    made = http.post("/workflow/template", json={
        "name": "computed", "input_schema": {"type": "object"},
        "steps": [{"id": "each", "foreach": {"items": "input.topics.filter(t, t.name != 'skip')"},
                   "agent": {"worker": world["worker"]}, "prompt": "About {{ item.name }}"}]})
    assert made.status_code == 201, made.text
    topics = [{"name": "green tea"}, {"name": "skip"}, {"name": "oolong"}, {"name": "sencha"}]
    run = http.post("/workflow/run", json={"template_id": made.json()["template_id"], "input": {"topics": topics}})
    trace_id = run.json()["trace_id"]
    finished(http, trace_id)
    page = console.page
    show(console, f"run/{trace_id}")
    expect(page.locator("section.run")).to_have_attribute("data-status", "succeeded")
    group = page.locator('.instances[data-container="each"]')
    names = group.locator("li.instance .instance-name")
    expect(names).to_have_text(["green tea", "oolong", "sencha"])
    expect(group.locator('li.instance[data-path="each[2]"] .instance-index')).to_have_text("#2")
    both_sizes(console, "third-items-by-value")
    assert console.errors == [], console.errors


def test_the_template_editor_third_pass(console: Console, world):
    """Run output takes several lines; six steps with one policy panel open are under
    3,000 px at 1280x800; an HTTP step's URL box shows its whole URL, query and secret
    placeholder included."""
    http, worker = world["http"], world["worker"]
    steps = [{"id": "plan", "agent": {"worker": worker}, "prompt": "{{input}}", "timeout_seconds": 60}]
    for previous, sid in zip(["plan", "draft", "check", "ask", "polish"], ["draft", "check", "ask", "polish", "publish"],
                             strict=True):
        agent = {"human": True} if sid == "ask" else {"worker": worker}
        steps.append({"id": sid, "agent": agent, "prompt": f"Work on {{{{steps.{previous}.output}}}}",
                      "depends_on": [previous]})
    six = http.post("/workflow/template", json={"name": "six-one", "steps": steps})
    assert six.status_code == 201, six.text
    for n in range(6):  # a template saved a few times: its versions are listed under the editor
        assert http.put(f"/workflow/template/{six.json()['template_id']}",
                        json={"name": "six-one", "steps": steps, "description": f"save {n}"}).status_code == 200
    page = console.page
    console.open(f"templates/{six.json()['template_id']}")
    page.reload()
    page.get_by_role("heading", name="Template six-one").wait_for()
    expect(page.locator("details.policies[open]")).to_have_count(1)
    tall = page.evaluate("document.documentElement.scrollHeight")
    print(f"six steps, one policy panel open: {tall} px at 1280x800")
    assert tall <= 3000, tall  # 3,427 px before
    page.get_by_text("Input, limits and output").click()
    output = page.get_by_label("Run output")
    assert output.evaluate(LINES_SHOWN) >= 2.9  # a multi-line field, also while empty (one line before)
    output.fill("{'text': steps.publish.output, 'plan': steps.plan.output}")
    assert output.evaluate("(t) => t.scrollHeight <= t.clientHeight + 2")
    both_sizes(console, "third-editor-six")

    http.post("/resource/secret", json={"name": "SEARCH_KEY", "value": "abcd1234", "hosts": ["api.example.com"]})
    url = "https://api.example.com/v1/search?q={{ input }}&limit=20&lang=en&key={{ secrets.SEARCH_KEY }}"
    fetch = http.post("/workflow/template", json={"name": "fetcher", "steps": [
        {"id": "get", "http": {"method": "GET", "url": url}}]})
    assert fetch.status_code == 201, fetch.text
    show(console, f"templates/{fetch.json()['template_id']}")
    page.get_by_role("heading", name="Template fetcher").wait_for()
    box = page.get_by_label("URL")
    expect(box).to_have_value(url)
    card = page.locator('fieldset[data-step-index="0"]').bounding_box()
    assert box.bounding_box()["width"] >= 0.9 * card["width"], (box.bounding_box(), card)  # a quarter before
    assert box.evaluate("(t) => t.scrollWidth <= t.clientWidth + 1 && t.scrollHeight <= t.clientHeight + 2")
    both_sizes(console, "third-http-url")
    page.set_viewport_size(PHONE)
    assert box.evaluate("(t) => t.scrollWidth <= t.clientWidth + 1 && t.scrollHeight <= t.clientHeight + 2")
    assert console.errors == [], console.errors


def test_the_navigation_is_one_line_and_the_usage_chart_is_sorted(console: Console, world):
    http = world["http"]
    for name in ("intake", "pair", LONG_NAME):
        run = http.post("/workflow/run", json={"template_id": world["templates"][name], "input": "x"}).json()
        finished(http, run["trace_id"])
    page = console.page
    show(console, "usage")
    tops = page.locator("header.top nav a").evaluate_all("(all) => all.map((a) => Math.round(a.getBoundingClientRect().top))")
    assert len(tops) >= 12 and len(set(tops)) == 1, tops  # two lines at 1280 px before
    chart = page.get_by_role("img", name="By template")
    expect(chart).to_contain_text("intake")
    rows = http.get("/usage", params={"group_by": "template"}).json()["rows"]
    names = {t["template_id"]: t["name"] for t in http.get("/workflow/template").json()["templates"]}
    by_cost = [r["key"] for r in sorted(rows, key=lambda r: (-float(r["cost_usd"]), names.get(r["key"], "")))]
    assert len(by_cost) >= 3 and by_cost != [r["key"] for r in rows] or len(set(by_cost)) >= 3
    assert chart.locator(".bar-row").evaluate_all("(all) => all.map((r) => r.dataset.key)") == by_cost
    overlaps = chart.locator(".bar-row").evaluate_all("""(all) => all.filter((r) => {
      const label = r.querySelector('.bar-label'), bar = r.querySelector('.bar');
      return label.getBoundingClientRect().right > bar.getBoundingClientRect().left
        || label.scrollWidth > label.clientWidth && label.title !== label.textContent;
    }).map((r) => r.dataset.key)""")
    assert overlaps == []
    long_row = chart.locator(f'.bar-row[data-key="{world["templates"][LONG_NAME]}"] .bar-label')
    expect(long_row).to_have_attribute("title", LONG_NAME)
    days = page.get_by_role("img", name="By day").locator(".bar-row").evaluate_all("(all) => all.map((r) => r.dataset.key)")
    assert days == sorted(days)
    both_sizes(console, "third-usage")
    assert console.errors == [], console.errors


def test_subscriptions_show_their_filter_and_their_errors(console: Console, world):
    page = console.page
    show(console, "subscriptions")
    page.get_by_role("heading", name="Subscriptions", exact=True).wait_for()
    page.get_by_label("URL").fill("http://127.0.0.1:9/closed")
    page.get_by_label("Runs of").select_option(label="pair")
    page.get_by_role("button", name="Add subscription").click()
    page.get_by_role("button", name="Done").click()
    page.get_by_label("URL").fill("http://127.0.0.1:9/every")
    page.get_by_role("button", name="Add subscription").click()
    page.get_by_role("button", name="Done").click()
    http = world["http"]
    subs = {s["url"].rsplit("/", 1)[1]: s for s in http.get("/workflow/subscription").json()["subscriptions"]}
    assert subs["closed"]["template_id"] == world["templates"]["pair"] and subs["every"]["template_id"] is None
    card = page.locator(f'article[data-subscription="{subs["closed"]["subscription_id"]}"]')
    expect(card.locator(".sub-filter")).to_have_text("Runs of the template pair only")
    expect(page.locator(f'article[data-subscription="{subs["every"]["subscription_id"]}"] .sub-filter')).to_have_text(
        "Runs of every template (all your runs)")
    run = http.post("/workflow/run", json={"template_id": world["templates"]["pair"], "input": "x"}).json()
    finished(http, run["trace_id"])
    sid = subs["closed"]["subscription_id"]
    for _ in range(200):  # the first attempt at a closed port
        deliveries = http.get(f"/workflow/subscription/{sid}/deliveries").json()["deliveries"]
        if deliveries and deliveries[0]["attempts"]:
            break
        time.sleep(0.1)
    error = deliveries[0]["attempts"][0]["error"]
    assert error and deliveries[0]["attempts"][0]["response_code"] is None
    card.get_by_text("Deliveries", exact=True).click()
    card.get_by_role("button", name="Refresh").click()
    expect(card.locator("td.codes .attempt-error").first).to_have_text(error)  # the error, not "—"
    both_sizes(console, "third-subscriptions")
    assert console.errors == [], console.errors


def test_a_killed_mcp_server_is_not_called_reachable(console: Console, world):
    http, server = world["http"], world["server"]
    with FakeMcpProcess() as fake:
        added = http.post("/resource/mcp", json={"name": "tools", "transport": "streamable_http", "url": fake.url})
        assert added.status_code == 201, added.text
        assert added.json()["server"]["last_error"] is None
    # the server is gone now; the API still holds what the check at its creation found
    assert http.get("/resource/mcp").json()["servers"][0]["last_error"] is None
    made = server.cli("user", "create", "bob", "--password-stdin", input=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr

    page = console.page
    show(console, "mcp")
    card = page.locator('article[data-mcp="tools"]')
    expect(card.locator(".mcp-check strong")).to_have_text("Not reached at the last check", timeout=45_000)
    expect(card).not_to_contain_text("Reachable")
    expect(card.locator("p.error")).to_contain_text("could not be reached")
    both_sizes(console, "third-mcp-admin")

    user = Console(console.page.context.browser, server, console.screenshots, width=DESKTOP["width"],
                   height=DESKTOP["height"])
    try:
        user.sign_in("bob")
        user.open("mcp")
        check = user.page.locator('article[data-mcp="tools"] .mcp-check')
        expect(check).to_contain_text("at the last check")
        expect(check.locator("time")).to_have_attribute("datetime", http.get("/resource/mcp").json()["servers"][0][
            "refreshed_at"])
        expect(user.page.locator('article[data-mcp="tools"]')).not_to_contain_text("Reachable")
        both_sizes(user, "third-mcp-user")
        assert user.errors == [], user.errors
    finally:
        user.close()
    assert console.errors == [], console.errors


def test_the_key_form_offers_templates_by_name(console: Console, world):
    page = console.page
    show(console, "keys")
    page.get_by_role("heading", name="API keys", exact=True).wait_for()
    page.get_by_label("Name", exact=True).fill("nightly")
    choice = page.get_by_role("group", name="Templates it may start")
    expect(choice.get_by_role("checkbox")).to_have_count(len(world["http"].get("/workflow/template").json()["templates"]))
    choice.get_by_role("checkbox", name="intake", exact=True).check()
    both_sizes(console, "third-key-form")
    page.get_by_role("button", name="Create key").click()
    page.locator("[data-new-key] code.secret").wait_for()
    keys = world["http"].get("/auth/key").json()["keys"]
    (key,) = [k for k in keys if k["name"] == "nightly"]
    assert key["templates"] == [world["templates"]["intake"]]
    page.get_by_role("button", name="Done").click()
    expect(page.locator('tr[data-key="nightly"] td[data-label="Templates"]')).to_have_text("intake")
    assert console.errors == [], console.errors
