"""The web console: size of what a browser loads, and time to first render on loopback.

    python benchmarks/bench_console.py [--loads 10]

Sizes: every .js and .css file the console ships, uncompressed and gzip'd (goal: under
300 KB uncompressed in total). Time to first render: Debian's Chromium (through Playwright)
opens `http://127.0.0.1:<port>/` in a fresh browser context (empty cache) and waits until
the sign-in form is on screen (timed by the driver, and by the page's own clock from
navigation start); then, signed in, until the run list has loaded from the API.
Median and worst of `--loads` loads each. Loopback only, bounded, stops by itself.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from benchmarks.common import orchestra_server  # noqa: E402
from orchestra.web.blueprints.console import CONSOLE_DIR  # noqa: E402

GOAL_BYTES = 300 * 1024
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def asset_sizes() -> tuple[int, int, list[tuple[str, int]]]:
    files = sorted(p for p in CONSOLE_DIR.rglob("*") if p.suffix in {".js", ".css"})
    rows = [(p.relative_to(CONSOLE_DIR).as_posix(), p.stat().st_size) for p in files]
    raw = sum(size for _, size in rows)
    packed = sum(len(gzip.compress(p.read_bytes(), 9)) for p in files)
    return raw, packed, rows


def time_renders(base: str, loads: int) -> tuple[list[float], list[float], list[float]]:
    from playwright.sync_api import sync_playwright

    httpx.post(f"{base}/api/v1/auth/register", json={"user_name": "bench", "password": "password-123"})
    cold, in_page, signed_in = [], [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        for _ in range(loads):
            context = browser.new_context()
            page = context.new_page()
            start = time.perf_counter()
            page.goto(base + "/")
            page.get_by_role("button", name="Sign in").wait_for()
            cold.append(time.perf_counter() - start)
            # The page's own clock (from navigation start), without the driver's round trips.
            in_page.append(page.evaluate("() => performance.now()") / 1000)
            page.get_by_label("User name").fill("bench")
            page.get_by_label("Password").fill("password-123")
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("button", name="Sign out").wait_for()
            start = time.perf_counter()
            page.reload()  # signed in (the session is in this tab): shell + API calls
            page.get_by_text("No runs yet.").wait_for()
            signed_in.append(time.perf_counter() - start)
            context.close()
        browser.close()
    return cold, in_page, signed_in


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=10)
    args = parser.parse_args()

    raw, packed, rows = asset_sizes()
    for name, size in rows:
        print(f"  {name:32} {size / 1024:7.1f} KB")
    verdict = "meets" if raw < GOAL_BYTES else "MISSES"
    print(f"JS+CSS: {raw / 1024:.1f} KB uncompressed, {packed / 1024:.1f} KB gzip'd "
          f"({len(rows)} files) — {verdict} the {GOAL_BYTES // 1024} KB goal")

    if not Path(CHROMIUM).exists():
        print(f"no Chromium at {CHROMIUM}: time to first render not measured (apt-get install chromium)")
        return
    env = {"ORCHESTRA_ARGON2_TIME_COST": "1", "ORCHESTRA_ARGON2_MEMORY_COST": "1024",
           "ORCHESTRA_ARGON2_PARALLELISM": "1"}
    with orchestra_server(env) as (base, _, _):
        cold, in_page, signed_in = time_renders(base, max(1, args.loads))
    for label, times in [("sign-in form, empty cache", cold),
                         ("sign-in form, empty cache, page's own clock (upper bound)", in_page),
                         ("run list, signed in (reload)", signed_in)]:
        print(f"first render, {label}: median {statistics.median(times) * 1000:.0f} ms, "
              f"worst {max(times) * 1000:.0f} ms over {len(times)} loads")


if __name__ == "__main__":
    main()
