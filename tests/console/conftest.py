"""Browser tests of the web console: Debian's Chromium driven by Playwright for Python,
against a real `orchestra serve` and the fake LLM.

Without Chromium (`apt-get install chromium`; another binary can be named with
ORCHESTRA_TEST_CHROMIUM) every browser test skips and says why (a failure in CI, which
requires every family); Playwright is a test dependency, imported by the modules as any
other (no module-level skip: a broken install is a collection error, never a silent skip). Screenshots of
each page go to ORCHESTRA_CONSOLE_SCREENSHOTS, or to a temporary folder that is printed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerProcess
from tests.fakes.fake_llm import FakeLLM

CHROMIUM = os.environ.get("ORCHESTRA_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PASSWORD = "password-123"


@pytest.fixture(scope="module")
def chromium():
    """A launched headless Chromium, shared by a module's browser tests (and closed after
    them, so Playwright's event loop is gone before other packages' async tests run)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests need Playwright for Python: pip install -e '.[test]'")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM}: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("ORCHESTRA_CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("console-screens"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {folder}")
    return folder


class Console:
    """One browser page on the console of `server`, recording every request it makes."""

    def __init__(self, browser, server: ServerProcess, screenshots: Path, *, width: int = 1280,
                 height: int = 900, color_scheme: str = "light") -> None:
        self.server = server
        self.screenshots = screenshots
        self.context = browser.new_context(viewport={"width": width, "height": height},
                                           color_scheme=color_scheme)
        self.page = self.context.new_page()
        self.requested: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requested.append(request.url))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        # Script errors; the browser's own "Failed to load resource" lines for the API's
        # 4xx answers (which the pages show) are not errors of the console.
        self.page.on("console", lambda m: m.type == "error" and not m.text.startswith("Failed to load resource")
                     and self.errors.append(m.text))
        self.page.set_default_timeout(15_000)

    def open(self, fragment: str = "") -> None:
        self.page.goto(f"{self.server.base_url}/{'#/' + fragment if fragment else ''}")

    def shot(self, name: str) -> Path:
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def sign_in(self, user_name: str, password: str = PASSWORD) -> None:
        self.open("login")
        self.page.get_by_label("User name").fill(user_name)
        self.page.get_by_label("Password").fill(password)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.get_by_role("button", name="Sign out").wait_for()

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    llm = FakeLLM()
    llm.start()
    yield llm
    llm.stop()


def start_server(home: Path, env: dict | None = None) -> ServerProcess:
    """A real server with a super administrator `root` made from the command line."""
    server = ServerProcess(home, env=env).start()
    made = server.cli("user", "create", "root", "--role", "SUPER_ADMINISTRATOR", "--password-stdin",
                      input=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr
    return server


@pytest.fixture
def served(tmp_path) -> Iterator[ServerProcess]:
    server = start_server(tmp_path / "home")
    yield server
    server.stop()


@pytest.fixture
def console(chromium, served, screenshots) -> Iterator[Console]:
    page = Console(chromium, served, screenshots)
    yield page
    page.close()
