"""`orchestra template versions | diff | restore` and `orchestra workflow fork` against a
real server process and the fake LLM (SPEC §13)."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.cli_harness import api_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


def finished(world, trace_id: str) -> dict:
    for _ in range(300):
        run = world["api"].get(f"/workflow/run/{trace_id}").json()
        if run["status"] in ("succeeded", "failed"):
            return run
        time.sleep(0.05)
    raise AssertionError("the run did not end")


def test_versions_diff_and_restore(world, tmp_path):
    cli = world["cli"]
    template = world["templates"]["three_step"]
    tid = template["template_id"]
    edited = tmp_path / "edit.json"
    steps = [dict(s) for s in template["template"]["steps"]]
    steps[2]["prompt"] += " Keep it short."
    edited.write_text(json.dumps({"steps": steps, "description": "shorter"}))
    assert cli("template", "update", "three_step", str(edited)).returncode == 0
    listed = cli("template", "versions", "three_step", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [v["version"] for v in json.loads(listed.stdout)] == [2, 1]
    shown = cli("template", "diff", "three_step")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["version 1 → 2", "~ report: prompt", "~ template: description"]
    as_json = json.loads(cli("template", "diff", tid, "--from", "1", "--to", "2", "--json").stdout)
    assert as_json["changed"] == [{"step_id": "report", "fields": ["prompt"]}]
    restored = cli("template", "restore", "three_step", "1")
    assert restored.returncode == 0, restored.stderr
    assert "as version 3" in restored.stderr
    assert world["api"].get(f"/workflow/template/{tid}").json()["template"]["steps"] == template["template"]["steps"]
    missing = cli("template", "restore", "three_step", "9")
    assert missing.returncode == 3 and "no version 9" in missing.stderr


def test_fork_from_a_step_with_a_set_output(world):
    cli = world["cli"]
    trace_id = cli("workflow", "run", "three_step", "--input", "tides").stdout.strip()
    finished(world, trace_id)
    calls = len(world["llm"].chat_requests)
    forked = cli("workflow", "fork", trace_id, "--set", "facts=\"the tide turns twice a day\"", "--watch")
    assert forked.returncode == 0, forked.stderr
    assert "[facts] set by the fork" in forked.stdout and "[numbers] reused" in forked.stdout
    prompts = [r["messages"][-1]["content"] for r in world["llm"].chat_requests[calls:]]
    assert len(prompts) == 1 and "Facts: the tide turns twice a day" in prompts[0]
    again = cli("workflow", "fork", trace_id, "--from", "numbers", "--json")
    assert again.returncode == 0, again.stderr
    body = json.loads(again.stdout)
    run = finished(world, body["trace_id"])
    assert body["forked_from"] == trace_id and run["forked_from"] == {"trace_id": trace_id, "from_step": "numbers"}
    assert {s["step_id"] for s in run["steps"] if s["reused"]} == {"facts"}
    bad = cli("workflow", "fork", trace_id, "--from", "nope")
    assert bad.returncode == 2 and "from_step" in bad.stderr


def test_run_a_pinned_version_with_a_budget_and_fork_says_drop_from(world, tmp_path):
    """Issue 39, point 5: `workflow run --version N --budget USD` reach the API's `version`
    and `budget_usd`; `fork --from S --set S=…` says that dropping --from sets S."""
    from orchestra.cli.console import ExitCode
    from tests.cli.cli_harness import one_error_line

    cli = world["cli"]
    created = cli("template", "create", "-", input=json.dumps({"name": "pinned", "steps": [
        {"id": "say", "agent": {"worker": "helper"}, "prompt": "first {{input}}"}]}))
    assert created.returncode == 0, created.stderr
    edited = tmp_path / "v2.json"
    edited.write_text(json.dumps({"steps": [{"id": "say", "agent": {"worker": "helper"}, "prompt": "second {{input}}"}]}))
    assert cli("template", "update", "pinned", str(edited)).returncode == 0
    ran = cli("workflow", "run", "pinned", "--input", "x", "--version", "1", "--watch")
    assert ran.returncode == 0, ran.stderr
    assert "Echo: first x" in ran.stdout, ran.stdout
    trace_id = ran.stdout.split()[1]
    assert world["api"].get(f"/workflow/run/{trace_id}").json()["template_version"] == 1
    budgeted = cli("workflow", "run", "pinned", "--version", "1", "--budget", "0.25")
    assert budgeted.returncode == 0, budgeted.stderr
    run = world["api"].get(f"/workflow/run/{budgeted.stdout.strip()}").json()
    assert run["template_version"] == 1 and run["budget_usd"] == "0.25", run  # (its provider has no prices)
    latest = cli("workflow", "run", "pinned", "--input", "y", "--watch")
    assert latest.returncode == 0 and "Echo: second y" in latest.stdout
    missing = cli("workflow", "run", "pinned", "--version", "9")
    assert missing.returncode == ExitCode.NOT_FOUND, missing.stderr
    both = cli("workflow", "fork", trace_id, "--from", "say", "--set", 'say="given"')
    assert both.returncode == ExitCode.USAGE
    line = one_error_line(both)
    assert "is from_step, which runs again" in line and "leave from_step out (the CLI's --from)" in line, line
