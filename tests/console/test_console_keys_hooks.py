"""The console's API keys and Webhooks pages in Chromium: a key is created (its secret
shown once), used, listed with its last use and revoked; a hook is created (URL and
secret shown once), listed and deleted. Each step is checked against the API."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from tests.console.conftest import PASSWORD, Console


def test_keys_and_hooks_pages(console: Console, served):
    page = console.page
    token = httpx.post(f"{served.base_url}/api/v1/auth/login",
                       json={"user_name": "root", "password": PASSWORD}).json()["access_token"]
    http = httpx.Client(base_url=served.base_url + "/api/v1", headers={"Authorization": f"Bearer {token}"})
    steps = [{"id": "h", "agent": {"human": True}, "prompt": "About {{input}}?"}]
    assert http.post("/workflow/template", json={"name": "intake", "steps": steps}).status_code == 201

    console.sign_in("root")
    page.get_by_role("link", name="API keys").click()
    page.get_by_role("heading", name="API keys", exact=True).wait_for()
    page.get_by_text("No keys yet").wait_for()
    page.get_by_label("Name", exact=True).fill("nightly")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("[data-new-key] code.secret").inner_text()
    assert secret.startswith("orc_")
    used = httpx.get(f"{served.base_url}/api/v1/workflow/run", headers={"Authorization": f"Bearer {secret}"})
    assert used.status_code == 200
    page.get_by_role("button", name="Done").click()
    assert secret not in page.content()
    page.reload()
    row = page.locator('tr[data-key="nightly"]')
    expect(row).to_contain_text("run:start run:read")
    expect(row).not_to_contain_text("never used")
    [info] = http.get("/auth/key").json()["keys"]
    assert info["last_used_at"] is not None
    expect(row.locator('td[data-label="Last used"]')).not_to_have_text("never")
    console.shot("keys")
    row.get_by_role("button", name="Revoke").click()
    page.get_by_role("button", name="Revoke nightly").click()
    page.get_by_text("Key 'nightly' revoked.").wait_for()
    assert http.get("/auth/key").json()["keys"] == []

    page.get_by_role("link", name="Webhooks").click()
    page.get_by_role("heading", name="Webhooks", exact=True).wait_for()
    page.get_by_text("No hooks yet").wait_for()
    page.get_by_label("Input (CEL)").fill("body.")
    page.get_by_role("button", name="Create hook").click()
    page.get_by_role("alert").filter(has_text="input").wait_for()
    page.get_by_label("Input (CEL)").fill("body.topic")
    page.get_by_role("button", name="Create hook").click()
    hook_secret = page.locator("[data-new-hook] code.secret").inner_text()
    assert hook_secret.startswith("whsec_")
    [hook] = http.get("/workflow/hook").json()["hooks"]
    assert hook["input"] == "body.topic" and hook["template_name"] == "intake"
    console.shot("hooks")
    page.get_by_role("button", name="Done").click()
    hook_row = page.locator(f'tr[data-hook="{hook["hook_id"]}"]')
    expect(hook_row).to_contain_text("intake")
    hook_row.get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Delete this hook").click()
    page.get_by_text("Hook deleted.").wait_for()
    assert http.get("/workflow/hook").json()["hooks"] == []
    assert console.errors == [], console.errors
