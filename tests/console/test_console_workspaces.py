"""The console's workspaces (SPEC §16) in Chromium against a real server: alice makes the
workspace "support" in the console, puts a template in it and adds bob as a runner (the
API's refusals — no such user, the last owner, an admin granting owner — shown in its own
words); bob switches to "support" (remembered across a reload), sees its template and not
alice's personal one, and sees its members without controls; alice's audit page lists
the `member.add` of bob, filters by action, pages with "Load more", and at 390 px
nothing is wider than the screen. Each step is checked against the API."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import httpx
from playwright.sync_api import expect

from orchestra.web.blueprints.console import CONSOLE_DIR
from tests.console.conftest import PASSWORD, Console
from tests.console.test_console_first_hour import OVERFLOWING

SERVICES = Path(__file__).parents[2] / "orchestra" / "services"


def register(server, user_name: str) -> httpx.Client:
    made = httpx.post(f"{server.base_url}/api/v1/auth/register", json={"user_name": user_name, "password": PASSWORD})
    assert made.status_code == 201, made.text
    token = httpx.post(f"{server.base_url}/api/v1/auth/login",
                       json={"user_name": user_name, "password": PASSWORD}).json()["access_token"]
    return httpx.Client(base_url=server.base_url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=15)


def switch_to(console: Console, name: str) -> None:
    console.page.get_by_label("Workspace", exact=True).select_option(label=name)


def template_names(page):
    """The names in the Templates page's list."""
    return page.locator("main table tbody tr td[data-label='Name'] a")


def test_the_audit_page_offers_every_action_the_server_writes():
    """The action filter's suggestions (js/pages/audit.js ACTIONS) are the names the
    services pass to audit.record: a new action missing there would not be offered."""
    written = set()
    for path in SERVICES.rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"\baction\s*=([^\n]*)", text):  # action="a.b", or "a.b" if … else "a.c"
            written |= set(re.findall(r'"([a-z_]+\.[a-z_]+)"', match.group(1)))
        written |= set(re.findall(r'audit\.Pending\(\s*"([a-z_]+\.[a-z_]+)"', text))  # by position
    assert {"member.add", "member.update", "member.remove", "template.create", "file.create"} <= written, written
    text = (CONSOLE_DIR / "js" / "pages" / "audit.js").read_text()
    offered = set(re.findall(r"'([a-z_]+\.[a-z_]+)'", re.search(r"export const ACTIONS = \[(.*?)\];", text, re.S).group(1)))
    assert written - offered == set()
    assert offered - written == set()  # nor a name the server never writes


def test_a_team_workspace_its_members_and_its_audit_log(chromium, served, screenshots):
    alice_api, bob_api, carol_api = (register(served, name) for name in ("alice", "bob", "carol"))
    steps = [{"id": "ask", "agent": {"human": True}, "prompt": "About {{input}}?"}]
    personal = alice_api.post("/workflow/template", json={"name": "alice-own", "steps": steps})
    assert personal.status_code == 201 and personal.json()["template"]["workspace_id"] is not None
    # bob's own, in his personal workspace: listed with "All workspaces", not in support.
    assert bob_api.post("/workflow/template", json={"name": "bob-own", "steps": steps}).status_code == 201

    alice = Console(chromium, served, screenshots)
    bob = carol = root = None
    try:
        page = alice.page
        alice.sign_in("alice")
        switcher = page.get_by_label("Workspace", exact=True)
        expect(switcher).to_have_value("")  # All workspaces: the API's default
        [mine] = alice_api.get("/workspace").json()["workspaces"]
        assert mine["personal"] is True
        expect(switcher.locator("option")).to_have_text(["All workspaces", "alice (personal)"])

        # A workspace made in the console: the console now works in it.
        page.get_by_role("link", name="Members").click()
        page.get_by_label("Workspace name").fill("support")
        page.get_by_role("button", name="Create workspace").click()
        page.get_by_text("Workspace 'support' created; you are its owner.").wait_for()
        spaces = alice_api.get("/workspace").json()["workspaces"]
        assert [(w["name"], w["personal"], w["role"]) for w in spaces] == [
            ("alice", True, "owner"), ("support", False, "owner")]
        support = spaces[1]["workspace_id"]
        expect(switcher).to_have_value(support)
        expect(switcher.locator("option")).to_have_text(["All workspaces", "alice (personal)", "support"])
        page.get_by_role("heading", name="Members of support").wait_for()
        expect(page.locator('tr[data-member="alice"]')).to_contain_text("alice (you)")

        # A template made while "support" is chosen is support's (workspace_id in the body).
        page.get_by_role("link", name="Templates").click()
        page.get_by_role("link", name="New template").click()
        page.get_by_label("Name", exact=True).fill("support-intake")
        page.locator('fieldset[data-step-index="0"]').get_by_label("Agent").select_option("human")
        page.get_by_role("button", name="Save template").click()
        page.get_by_text("Template 'support-intake' created.").wait_for()
        in_support = alice_api.get(f"/workflow/template?workspace_id={support}").json()["templates"]
        assert [(t["name"], t["workspace_id"]) for t in in_support] == [("support-intake", support)]

        # A provider of support's own (alice is a USER: the page is hers as support's owner),
        # offered to support's workers beside the instance-wide ones.
        page.get_by_role("link", name="Providers").click()
        expect(page.locator("[data-provider-scope]")).to_contain_text("support")
        page.get_by_label("Name", exact=True).fill("support-llm")
        page.get_by_label("Kind").select_option("openai_compatible")
        page.get_by_label("Model id").fill("fake-model")
        page.get_by_label("Base URL").fill("http://127.0.0.1:9/v1")
        page.get_by_role("button", name="Add provider").click()
        page.get_by_text("Provider 'support-llm' added.").wait_for()
        own = alice_api.get(f"/provider?workspace_id={support}").json()["providers"]
        assert [(p["name"], p["workspace_id"]) for p in own] == [("support-llm", support)]
        assert alice_api.get("/provider").json()["providers"] == []  # not an instance-wide one
        page.get_by_role("link", name="Workers").click()
        expect(page.get_by_label("Provider").locator("option")).to_have_text(
            ["support-llm (openai_compatible, fake-model, this workspace's)"])

        # Members: the API's refusals next to the form, in its own words.
        page.get_by_role("link", name="Members").click()
        form = page.locator("form", has=page.get_by_role("heading", name="Add a member"))
        form.get_by_label("User name").fill("nobody")
        form.get_by_role("button", name="Add member").click()
        refused = alice_api.post(f"/workspace/{support}/member", json={"user_name": "nobody", "role": "viewer"})
        assert refused.status_code == 404 and refused.json()["error"] == "UserNotExistError"
        expect(form.get_by_role("alert")).to_have_text(refused.json()["message"])
        form.get_by_label("User name").fill("bob")
        form.get_by_label("Role").select_option("runner")
        form.get_by_role("button", name="Add member").click()
        page.get_by_text("bob was added as runner.").wait_for()
        expect(form.get_by_role("alert")).to_have_count(0)
        form.get_by_label("User name").fill("carol")
        form.get_by_label("Role").select_option("admin")
        form.get_by_role("button", name="Add member").click()
        page.get_by_text("carol was added as admin.").wait_for()
        members = alice_api.get(f"/workspace/{support}/member").json()["members"]
        assert {(m["user_name"], m["role"]) for m in members} == {("alice", "owner"), ("bob", "runner"), ("carol", "admin")}
        # The last owner cannot step down: 409 at her row, and she stays owner.
        row = page.locator('tr[data-member="alice"]')
        row.get_by_label("Role of alice").select_option("admin")
        row.get_by_role("button", name="Save role").click()
        alice_id = next(m["user_id"] for m in members if m["user_name"] == "alice")
        last_owner = alice_api.put(f"/workspace/{support}/member/{alice_id}", json={"role": "admin"})
        assert last_owner.status_code == 409, last_owner.text
        expect(page.locator("tr.result").get_by_role("alert")).to_have_text(last_owner.json()["message"])
        assert {(m["user_name"], m["role"]) for m in alice_api.get(f"/workspace/{support}/member").json()["members"]} \
            == {("alice", "owner"), ("bob", "runner"), ("carol", "admin")}
        alice.shot("workspace-members")

        # An admin (carol) manages members, but only an owner grants owner: the 403 names it.
        carol = Console(chromium, served, screenshots)
        carol.sign_in("carol")
        switch_to(carol, "support")
        carol.open("members")
        carol_row = carol.page.locator('tr[data-member="bob"]')
        carol_row.get_by_label("Role of bob").select_option("owner")
        carol_row.get_by_role("button", name="Save role").click()
        bob_id = next(m["user_id"] for m in members if m["user_name"] == "bob")
        denied = carol_api.put(f"/workspace/{support}/member/{bob_id}", json={"role": "owner"})
        assert denied.status_code == 403 and "owner" in denied.json()["message"], denied.text
        expect(carol.page.locator("tr.result").get_by_role("alert")).to_have_text(denied.json()["message"])

        # bob: "support" chosen, remembered across a reload; its template, not alice's personal one.
        bob = Console(chromium, served, screenshots)
        bob_page = bob.page
        bob.sign_in("bob")
        bob_switcher = bob_page.get_by_label("Workspace", exact=True)
        expect(bob_switcher.locator("option")).to_have_text(["All workspaces", "bob (personal)", "support"])
        bob.open("templates")
        expect(template_names(bob_page)).to_have_count(2)  # all of his: his own and support's
        switch_to(bob, "support")
        expect(template_names(bob_page)).to_have_text(["support-intake"])
        assert any(f"/workflow/template?workspace_id={support}" in url for url in bob.requested), bob.requested
        assert bob_page.evaluate("() => Object.entries(localStorage)") == [[f"orchestra.workspace.{bob_id}", support]]
        bob_page.reload()
        expect(bob_switcher).to_have_value(support)
        expect(template_names(bob_page)).to_have_text(["support-intake"])
        main = bob_page.locator("main").inner_text()
        assert "alice-own" not in main and "bob-own" not in main
        assert [t["name"] for t in bob_api.get(f"/workflow/template?workspace_id={support}").json()["templates"]] \
            == ["support-intake"]
        expect(bob_page.locator("header nav").get_by_role("link", name="Providers")).to_have_count(0)  # a runner's
        # The members without controls: a runner changes nothing.
        bob_page.get_by_role("link", name="Members").click()
        bob_page.get_by_role("heading", name="Members of support").wait_for()
        expect(bob_page.locator("tr[data-member]")).to_have_count(3)
        expect(bob_page.locator('tr[data-member="bob"]')).to_contain_text("runner")
        expect(bob_page.locator("main select, main button:not(.link)").filter(
            has_not_text="Create workspace")).to_have_count(0)
        expect(bob_page.get_by_role("heading", name="Add a member")).to_have_count(0)
        expect(bob_page.locator("[data-my-role]")).to_have_text("runner")
        # Nor the audit log: the API's 403 naming admin.
        bob_page.get_by_role("link", name="Audit log").click()
        bob_denied = bob_api.get(f"/audit?workspace_id={support}")
        assert bob_denied.status_code == 403 and bob_denied.json()["detail"]["role_needed"] == "admin"
        expect(bob_page.get_by_role("alert")).to_have_text(bob_denied.json()["message"])
        # "All workspaces" again: the lists are the API's default.
        switch_to(bob, "All workspaces")
        bob.open("templates")
        expect(template_names(bob_page)).to_have_count(2)
        assert sorted(template_names(bob_page).all_inner_texts()) == ["bob-own", "support-intake"] == sorted(
            t["name"] for t in bob_api.get("/workflow/template").json()["templates"])
        assert bob_page.evaluate("() => Object.keys(localStorage)") == []

        # alice's audit page: the member.add of bob, a filter, "Load more".
        for i in range(50):  # more entries than a page holds (50)
            assert alice_api.put(f"/workspace/{support}/member/{bob_id}",
                                 json={"role": "viewer" if i % 2 == 0 else "runner"}).status_code == 200
        page.get_by_role("link", name="Audit log").click()
        page.get_by_role("heading", name="Audit log").wait_for()
        everything = []
        cursor = None
        while True:
            answer = alice_api.get(f"/audit?workspace_id={support}&limit=1000" + (f"&cursor={cursor}" if cursor else "")).json()
            everything += answer["entries"]
            cursor = answer["next_cursor"]
            if not cursor:
                break
        assert len(everything) > 50
        rows = page.locator("tr[data-audit]")
        expect(rows).to_have_count(50)
        page.get_by_role("button", name="Load more").click()
        expect(rows).to_have_count(len(everything))
        expect(page.get_by_role("button", name="Load more")).to_have_count(0)
        assert page.locator("tr[data-audit]").evaluate_all("(all) => all.map((r) => r.dataset.audit)") == [
            e["action"] for e in everything]
        page.get_by_label("Action").fill("member.add")
        page.get_by_role("button", name="Filter").click()
        added = [e for e in everything if e["action"] == "member.add"]
        expect(rows).to_have_count(len(added))
        assert {e["target"]["name"] for e in added} == {"bob", "carol"}
        bob_row = page.locator("tr[data-audit='member.add']", has_text="bob")
        expect(bob_row.locator("td[data-label='Actor']")).to_have_text("alice")
        expect(bob_row.locator("td[data-label='Target']")).to_have_text("member bob")
        expect(bob_row.locator("td[data-label='Changes']")).to_have_text("role: – → runner")
        assert any("action=member.add" in url and f"workspace_id={support}" in url for url in alice.requested)
        alice.shot("workspace-audit")
        # Dates: `from` is included, so from tomorrow (UTC) nothing matches, up to tomorrow all of it.
        tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).date().isoformat()
        page.get_by_label("From").fill(tomorrow)
        page.get_by_role("button", name="Filter").click()
        page.get_by_text("No entries match the filter.").wait_for()
        assert alice_api.get(f"/audit?workspace_id={support}&from={tomorrow}").json()["entries"] == []
        page.get_by_role("button", name="Clear").click()
        page.get_by_label("To", exact=True).fill(tomorrow)
        page.get_by_role("button", name="Filter").click()
        expect(rows).to_have_count(50)
        expect(page.get_by_label("Action")).to_have_value("")

        # A super administrator's "All workspaces": every chain, the instance-level logins too.
        root = Console(chromium, served, screenshots)
        root.sign_in("root")
        root.open("audit")
        root.page.get_by_label("Action").fill("auth.login")
        root.page.get_by_role("button", name="Filter").click()
        token = httpx.post(f"{served.base_url}/api/v1/auth/login",
                           json={"user_name": "root", "password": PASSWORD}).json()["access_token"]
        logins = httpx.get(f"{served.base_url}/api/v1/audit?action=auth.login&actor=carol",
                           headers={"Authorization": f"Bearer {token}"}).json()["entries"]
        assert len(logins) == 2 and {e["workspace_id"] for e in logins} == {None}  # the API's and the console's
        expect(root.page.locator("tr[data-audit='auth.login']", has_text="carol")).to_have_count(2)
        assert not any("workspace_id=" in url for url in root.requested if "/audit" in url)

        # At 390 px: nothing wider than the screen; the workspace bar one line, in sight.
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(200)
        assert page.evaluate(OVERFLOWING) == []
        assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
        expect(switcher).to_be_visible()
        bar = page.locator("nav.workspace-bar").bounding_box()
        assert bar["width"] <= 390 and bar["height"] <= 50, bar
        alice.shot("workspace-audit-390")
        page.get_by_role("link", name="Members").click()
        page.get_by_role("heading", name="Members of support").wait_for()
        assert page.evaluate(OVERFLOWING) == []
        alice.shot("workspace-members-390")
        assert alice.errors == [] and bob.errors == [] and carol.errors == [] and root.errors == []
    finally:
        for console in (alice, bob, carol, root):
            if console:
                console.close()


def test_the_template_editor_offers_the_template_s_workspace_s_workers(console, served):
    """A step names a worker of its template's workspace (SPEC §16), so the editor offers
    those only: a new template's the chosen workspace's (with "All workspaces" the
    personal one, where it is saved), an existing template's its own workspace's —
    bob's worker in support for alice's support template, never her personal one."""
    alice_api, bob_api = register(served, "alice"), register(served, "bob")
    root = httpx.post(f"{served.base_url}/api/v1/auth/login", json={"user_name": "root", "password": PASSWORD})
    provider = httpx.post(f"{served.base_url}/api/v1/provider", headers={
        "Authorization": f"Bearer {root.json()['access_token']}"}, json={
        "name": "llm", "provider": "openai_compatible", "model_id": "fake-model", "base_url": "http://127.0.0.1:9/v1"})
    assert provider.status_code == 201, provider.text
    pid = provider.json()["provider_id"]
    support = alice_api.post("/workspace", json={"name": "support"}).json()["workspace_id"]
    assert alice_api.post(f"/workspace/{support}/member",
                          json={"user_name": "bob", "role": "editor"}).status_code == 201
    assert alice_api.post("/agent/worker", json={"name": "mine", "provider_id": pid}).status_code == 201
    helper = bob_api.post("/agent/worker", json={"name": "helper", "provider_id": pid, "workspace_id": support})
    assert helper.status_code == 201, helper.text
    made = alice_api.post("/workflow/template", json={
        "name": "team-t", "workspace_id": support, "steps": [{"id": "a", "agent": {"worker": "helper"}, "prompt": "p"}]})
    assert made.status_code == 201, made.text

    page = console.page
    console.sign_in("alice")
    worker = page.locator('fieldset[data-step-index="0"]').get_by_label("Worker")
    console.open("templates/new")
    expect(worker.locator("option")).to_have_text(["mine"])
    switch_to(console, "support")
    console.open("templates/new")
    expect(worker.locator("option")).to_have_text(["helper"])
    switch_to(console, "All workspaces")
    console.open(f"templates/{made.json()['template_id']}")
    expect(worker.locator("option")).to_have_text(["helper"])
    expect(worker).to_have_value(helper.json()["worker_id"])
    assert console.errors == []
