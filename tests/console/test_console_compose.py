"""Composition in the console, in Chromium against a real server (SPEC §14): an
administrator stores a secret (its value never shown again), builds a template whose
steps are an HTTP request naming the secret and a child workflow in the step editor;
the parent's run page opens the child run from its step, and the child's page links
back; the secret never reaches the page."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from orchestra.testing.fake_http import FakeHttp
from tests.console.test_console_first_hour import api, step

VALUE = "console-secret-9876abcd"


def test_secrets_http_steps_and_child_runs_in_the_console(console):
    page = console.page
    http = api(console, "root")
    with FakeHttp() as target:
        console.sign_in("root")
        console.open("secrets")
        page.get_by_role("heading", name="Secrets", exact=True).wait_for()
        page.get_by_label("Name", exact=True).fill("CRM")
        page.get_by_label("Value", exact=True).fill(VALUE)
        page.get_by_label("Hosts", exact=True).fill("127.0.0.1, *.example.com")
        page.get_by_role("button", name="Store secret").click()
        page.get_by_text("Secret 'CRM' stored (…abcd), sent only to 127.0.0.1, *.example.com.", exact=False).wait_for()
        expect(page.locator('tr[data-secret="CRM"]')).to_contain_text("…abcd")
        expect(page.locator('tr[data-secret="CRM"]')).to_contain_text("127.0.0.1, *.example.com")
        assert http.get("/resource/secret").json()["secrets"][0]["hosts"] == ["127.0.0.1", "*.example.com"]
        assert VALUE not in page.content()

        # the child: one HTTP step, built in the step editor
        console.open("templates/new")
        page.get_by_role("heading", name="New template").wait_for()
        page.get_by_label("Name", exact=True).fill("lookup")
        step(page, 0).get_by_label("Agent").select_option("http")
        step(page, 0).get_by_label("Method").select_option("POST")
        step(page, 0).get_by_label("URL").fill(target.url + "/echo?q={{ input }}")
        step(page, 0).get_by_label("Headers").fill("Authorization: Bearer {{ secrets.CRM }}")
        step(page, 0).get_by_label("Body").fill('{"company": "{{ input }}"}')
        page.get_by_role("button", name="Save template").click()
        page.get_by_text("Template 'lookup' created.").wait_for()
        child_id = page.url.rsplit("/", 1)[1]
        saved = http.get(f"/workflow/template/{child_id}").json()["template"]
        assert saved["steps"][0]["http"] == {
            "method": "POST", "url": target.url + "/echo?q={{ input }}",
            "headers": {"Authorization": "Bearer {{ secrets.CRM }}"}, "body": {"company": "{{ input }}"}}

        # a secret in the body is refused next to the field
        step(page, 0).get_by_label("Body").fill('{"key": "{{ secrets.CRM }}"}')
        page.get_by_role("button", name="Save template").click()
        step(page, 0).get_by_text("secrets may be used only").wait_for()

        # the parent: a workflow step calling it by name
        console.open("templates/new")
        page.get_by_role("heading", name="New template").wait_for()
        page.get_by_label("Name", exact=True).fill("research")
        step(page, 0).get_by_label("Agent").select_option("workflow")
        step(page, 0).get_by_label("Template", exact=True).fill("lookup")
        page.get_by_role("button", name="Save template").click()
        page.get_by_text("Template 'research' created.").wait_for()
        parent_id = page.url.rsplit("/", 1)[1]
        saved = http.get(f"/workflow/template/{parent_id}").json()["template"]
        assert saved["steps"][0]["workflow"] == {"template": child_id, "input": "input"}

        started = http.post("/workflow/run", json={"template_id": parent_id, "input": "acme"})
        trace_id = started.json()["trace_id"]
        console.open(f"run/{trace_id}")
        page.locator('section.run[data-status="succeeded"]').wait_for()
        console.shot("parent-run")
        page.get_by_role("link", name="Open the child run").click()
        page.wait_for_url(re.compile(r"#/run/[0-9a-f-]{36}$"))
        assert trace_id not in page.url
        page.locator('section.run[data-status="succeeded"]').wait_for()
        page.locator("p.parent-run").get_by_role("link").wait_for()
        expect(page.locator("p.http-request")).to_contain_text("POST " + target.url + "/echo")
        assert VALUE not in page.content()
        assert "***" in page.content()  # the echoed header, redacted
        page.locator("p.parent-run").get_by_role("link").click()
        page.wait_for_url(re.compile(rf"#/run/{trace_id}$"))
        console.shot("child-run")
        assert console.errors == [], console.errors


def test_a_childs_question_is_answered_from_its_parents_page(console):
    """The child asks; the parent's page shows the question and its reply goes to the
    child's trace; the child's answer is then the parent's output."""
    page = console.page
    http = api(console, "root")
    leaf = http.post("/workflow/template", json={"name": "approve", "steps": [
        {"id": "ask", "agent": {"human": True}, "prompt": "Approve {{input}}?"}]})
    assert leaf.status_code == 201, leaf.text
    top = http.post("/workflow/template", json={"name": "plan", "steps": [
        {"id": "sub", "workflow": {"template": "approve", "input": "input"}}]})
    assert top.status_code == 201, top.text
    trace_id = http.post("/workflow/run", json={"template_id": top.json()["template_id"],
                                                "input": "the plan"}).json()["trace_id"]
    console.sign_in("root")
    console.open(f"run/{trace_id}")
    page.get_by_text("Approve the plan?").first.wait_for()
    child = next(s["child_trace_id"] for s in http.get(f"/workflow/run/{trace_id}").json()["steps"])
    page.get_by_label("Your reply").fill("yes, go")
    page.get_by_role("button", name="Send reply").click()
    page.locator('section.run[data-status="succeeded"]').wait_for()
    assert http.get(f"/workflow/run/{trace_id}").json()["output"] == "yes, go"
    answered = [e for e in http.get(f"/workflow/run/{child}/events").json()["events"]
                if e["kind"] == "reply_received"]
    assert [e["data"]["content"] for e in answered] == ["yes, go"]  # stored on the child's trace
    assert page.get_by_label("Your reply").count() == 0
    assert console.errors == [], console.errors
