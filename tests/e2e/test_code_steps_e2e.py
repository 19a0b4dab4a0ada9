"""Code steps (SPEC §17) against a real `orchestra serve` (SQLite): the four workflows of
issue 35 in one template (examples/templates/code_results.json: sentences, a sum, CSV rows
from a foreach, the top three), a runtime error with its line, a 422 naming the source's line and column, and four
`while True` steps bounded while another client's requests stay quick; the server
then stops cleanly with its code workers."""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "templates" / "code_results.json"
INPUT = {"ticket": "My card was charged twice. Please refund! Thanks.",
         "results": [{"name": "a", "amount": 2.5, "score": 3}, {"name": "b", "amount": 4, "score": 9},
                     {"name": "c", "amount": 1, "score": 5}, {"name": "d", "amount": 0.5, "score": 7}]}


def wait(http: httpx.Client, trace_id: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = http.get(f"/workflow/run/{trace_id}").json()
        if body["status"] in ("succeeded", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_code_steps_compute_fail_with_lines_and_spin_without_slowing_others(tmp_path):
    server = ServerProcess(tmp_path / "home", env={"ORCHESTRA_CODE_TIMEOUT_MS": "1000"}).start()
    try:
        http = httpx.Client(base_url=server.base_url + "/api/v1",
                            headers=login(server, "admin", "ADMINISTRATOR"), timeout=30)
        bad = http.post("/workflow/template", json={"name": "bad", "steps": [
            {"id": "x", "code": {"source": "total = 0\nfor r in input:\n    total += (r\n"}}]})
        assert bad.status_code == 422, bad.text
        assert {"field": "steps.0.code.source", "problem": "line 3, column 14: '(' was never closed"} in \
            bad.json()["detail"]

        body = json.loads(EXAMPLE.read_text())
        # template check runs each top-level code step once on examples of its inputs
        checked = http.post("/workflow/template/check", json=body)
        assert checked.status_code == 200 and checked.json()["problems"] == [], checked.text
        wrong = http.post("/workflow/template/check", json={"name": "w", "steps": [
            {"id": "n", "code": {"source": "x = 1\nint(input)"}}]})
        assert wrong.json()["problems"] == [{"field": "steps.0.code.source", "problem":
            "on example inputs (input: \"text\"): ValueError: invalid literal for int() with base 10: 'text' (line 2)"}]
        body["steps"].append({"id": "bad", "depends_on": ["top"], "on_error": "continue",
                              "code": {"source": "names = steps['top']['output']\n\n\nint(names[0])"}})
        made = http.post("/workflow/template", json=body)
        assert made.status_code == 201, made.text
        started = http.post("/workflow/run", json={"template_id": made.json()["template_id"], "input": INPUT})
        assert started.status_code == 202, started.text
        detail = wait(http, started.json()["trace_id"])
        assert detail["status"] == "succeeded", detail
        steps = {s["path"]: s for s in detail["steps"]}
        assert steps["sentences"]["output"] == ["My card was charged twice", "Please refund", "Thanks."]
        assert steps["total"]["output"] == 8.0
        assert steps["rows"]["output"] == ["0,a,2.5", "1,b,4", "2,c,1", "3,d,0.5"]
        assert steps["top"]["output"] == ["b", "d", "c"]
        report = detail["output"]
        assert report == {"sentences": 3, "total": 8.0, "top": ["b", "d", "c"], "at": report["at"],
                          "csv": "index,name,amount\n0,a,2.5\n1,b,4\n2,c,1\n3,d,0.5"}
        shown = steps["report"]["started_at"].removesuffix("Z")  # the API shows milliseconds
        assert report["at"].startswith(shown), (report["at"], shown)  # the clock: the stored start
        assert steps["bad"]["status"] == "failed"
        assert steps["bad"]["error"] == "ValueError: invalid literal for int() with base 10: 'b' (line 4)"

        spin = http.post("/workflow/template", json={"name": "spin", "steps": [
            {"id": f"s{i}", "on_error": "continue", "code": {"source": "while True:\n    pass"}}
            for i in range(4)]})
        assert spin.status_code == 201, spin.text
        latencies: list[float] = []
        done = threading.Event()

        def victim() -> None:
            with httpx.Client(base_url=server.base_url + "/api/v1", timeout=10) as other:
                while not done.is_set():
                    began = time.perf_counter()
                    assert other.get("/auth/list").status_code in (200, 401)
                    latencies.append(time.perf_counter() - began)
                    time.sleep(0.01)

        thread = threading.Thread(target=victim)
        thread.start()
        began = time.monotonic()
        trace_id = http.post("/workflow/run", json={"template_id": spin.json()["template_id"],
                                                    "input": "x"}).json()["trace_id"]
        spun = wait(http, trace_id)
        took = time.monotonic() - began
        done.set()
        thread.join()
        assert spun["status"] == "succeeded", spun
        errors = [s["error"] for s in spun["steps"]]
        assert set(errors) == {"the code ran past its time limit of 1000 ms (ORCHESTRA_CODE_TIMEOUT_MS)"} and len(errors) == 4, errors
        assert took < 10
        p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else latencies[0]
        print(f"victim: {len(latencies)} requests, p50 {statistics.median(latencies) * 1000:.1f} ms, "
              f"p99 {p99 * 1000:.1f} ms")
        assert p99 < 0.25, f"another client's p99 was {p99 * 1000:.0f} ms while code steps spun"
        http.close()
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log_path.read_text()[-2000:]
