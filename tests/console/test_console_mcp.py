"""The console's MCP servers page in Chromium, at a phone's 390 px: an administrator adds
a real streamable-HTTP MCP server (the SDK-built one on loopback), sees its tools, which
then appear among a worker's tools; a refresh of a server that went away shows why; the
delete of a server a worker uses names the worker; a plain user reads, without controls."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from orchestra.testing.fake_mcp import FakeMcpProcess
from tests.console.conftest import PASSWORD, Console


def test_mcp_servers_page_at_390_px(chromium, served, screenshots):
    console = Console(chromium, served, screenshots, width=390, height=844)
    page = console.page
    with FakeMcpProcess() as fake:
        try:
            console.sign_in("root")
            page.get_by_role("button", name="Menu").click()  # a phone: the navigation is a menu
            page.get_by_role("link", name="MCP servers").click()
            page.get_by_role("heading", name="MCP servers", exact=True).wait_for()
            page.get_by_text("No MCP servers yet").wait_for()
            page.get_by_label("Name", exact=True).fill("fake")
            page.get_by_label("URL").fill(fake.url)
            page.get_by_label("Headers").fill("Authorization=Bearer console-secret-7777")
            page.get_by_role("button", name="Add MCP server").click()
            page.get_by_text("MCP server 'fake' added with").wait_for()
            row = page.locator('article[data-mcp="fake"]')
            expect(row).to_contain_text("Authorization: …7777")
            assert "console-secret" not in page.content()
            row.get_by_text("Tools (7)").click()
            page.get_by_text("fake.echo").wait_for()
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, width
            console.shot("mcp-390")

            # the stdio refusal names the setting, next to the form
            page.get_by_label("Name", exact=True).fill("shell")
            page.get_by_label("Transport").select_option("stdio")
            page.get_by_label("Command").fill("sh")
            page.get_by_role("button", name="Add MCP server").click()
            page.get_by_role("alert").filter(has_text="ORCHESTRA_MCP_STDIO_COMMANDS").wait_for()

            # its tools are offered for a worker
            token = httpx.post(f"{served.base_url}/api/v1/auth/login",
                               json={"user_name": "root", "password": PASSWORD}).json()["access_token"]
            http = httpx.Client(base_url=served.base_url + "/api/v1", headers={"Authorization": f"Bearer {token}"})
            provider = http.post("/provider", json={"name": "p", "provider": "openai_compatible",
                                                    "model_id": "m", "base_url": "http://127.0.0.1:9"}).json()
            page.get_by_role("button", name="Menu").click()
            page.get_by_role("link", name="Workers").click()
            page.get_by_role("checkbox", name="fake.echo").wait_for()
            made = http.post("/agent/worker", json={"name": "user-of-echo", "provider_id": provider["provider_id"],
                                                    "tools": ["fake.echo"]})
            assert made.status_code == 201, made.text

            # refresh of a server that went away shows why; delete names the worker
            page.get_by_role("button", name="Menu").click()  # a phone: the navigation is a menu
            page.get_by_role("link", name="MCP servers").click()
            fake.stop()
            row.get_by_role("button", name="Refresh").click()
            page.get_by_role("alert").filter(has_text="could not be reached").wait_for()
            row.get_by_role("button", name="Delete").click()
            page.get_by_role("button", name="Delete fake").click()
            page.locator("ul.blockers").get_by_text("user-of-echo").wait_for()
            console.shot("mcp-390-blocked")
            assert console.errors == [], console.errors
        finally:
            console.close()
