"""`orchestra skill | tool | reload | template | file | worker update | workflow run/events`
through a real server, each checked against what the API then holds."""

from __future__ import annotations

import hashlib
import json
import re
import time

import pytest

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import EXAMPLES, api_world, one_error_line


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


def wait_status(world, trace_id: str, statuses: set[str], timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = world["api"].get(f"/workflow/run/{trace_id}").json()
        if run["status"] in statuses or time.monotonic() > deadline:
            assert run["status"] in statuses, run
            return run
        time.sleep(0.1)


# --- skills, tools, reload --------------------------------------------------------------


def test_skill_create_show_update_delete(world):
    cli = world["cli"]
    done = cli("skill", "create", "terse", "--description", "short answers", "--instructions", "-",
               input="Answer in one line.\n")
    assert done.returncode == 0, done.stderr
    skill_id = done.stdout.strip()
    stored = world["api"].get(f"/resource/skill/{skill_id}").json()
    assert (stored["name"], stored["description"], stored["instructions"]) == (
        "terse", "short answers", "Answer in one line.")

    listed = json.loads(cli("skill", "list", "--json").stdout)
    assert [s["skill_id"] for s in listed] == [s["skill_id"] for s in
                                               world["api"].get("/resource/skill").json()["skills"]]
    assert "terse" in cli("skill", "list").stdout
    shown = json.loads(cli("skill", "show", "terse", "--json").stdout)
    assert shown == {k: v for k, v in stored.items() if k != "message"}
    assert "instructions: Answer in one line." in cli("skill", "show", skill_id).stdout

    done = cli("skill", "update", "terse", "--name", "brief", "--instructions", "One line only.")
    assert done.returncode == 0, done.stderr
    stored = world["api"].get(f"/resource/skill/{skill_id}").json()
    assert (stored["name"], stored["description"], stored["instructions"]) == (
        "brief", "short answers", "One line only.")
    assert cli("skill", "update", "brief").returncode == ExitCode.USAGE

    bound = cli("worker", "create", "with-skill", "--provider", "fake", "--skill", "brief")
    assert bound.returncode == 0, bound.stderr
    cli("worker", "delete", bound.stdout.strip())

    assert cli("skill", "delete", "brief").returncode == ExitCode.USAGE  # no terminal, no --yes
    done = cli("skill", "delete", "brief", "--yes")
    assert done.returncode == 0, done.stderr
    assert world["api"].get(f"/resource/skill/{skill_id}").status_code == 404
    gone = cli("skill", "show", "brief")
    assert gone.returncode == ExitCode.NOT_FOUND and "unknown skill 'brief'" in one_error_line(gone)


def test_tool_list_matches_the_catalog(world):
    cli = world["cli"]
    tools = json.loads(cli("tool", "list", "--json").stdout)
    assert tools == world["api"].get("/resource/tool").json()["tools"]
    assert {"calculator", "current_time", "read_upload", "ask_user"} <= {t["name"] for t in tools}
    assert "calculator" in cli("tool", "list").stdout


def test_reload_answers_the_counts(world):
    done = world["cli"]("reload", "--json")
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert counts["nodes"] == 3 and counts["workers"] >= 1
    plain = world["cli"]("reload")
    assert plain.returncode == 0 and "reloaded" in plain.stderr and "3 nodes" in plain.stderr


def test_account_register_list_set_role_delete_through_the_api(world, tmp_path):
    from tests.cli.cli_harness import PASSWORD, ClientCLI

    cli = world["cli"]
    stranger = ClientCLI(tmp_path / "stranger")  # no login: registering needs none
    done = stranger("account", "register", "newcomer", "--password-stdin", "--server",
                    world["server"].base_url, input=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    user_id = done.stdout.strip()
    users = {u["user_name"]: u for u in world["api"].get("/auth/list").json()["users"]}
    assert users["newcomer"]["user_id"] == user_id and users["newcomer"]["role"] == "USER"
    assert json.loads(cli("account", "list", "--json").stdout) == world["api"].get("/auth/list").json()["users"]
    assert "newcomer" in cli("account", "list").stdout

    done = cli("account", "set-role", "newcomer", "administrator")
    assert done.returncode == 0 and "newcomer is now ADMINISTRATOR" in done.stderr
    users = {u["user_name"]: u for u in world["api"].get("/auth/list").json()["users"]}
    assert users["newcomer"]["role"] == "ADMINISTRATOR"
    assert cli("account", "set-role", "newcomer", "KING").returncode == ExitCode.USAGE
    assert stranger("account", "list", "--server", world["server"].base_url).returncode == ExitCode.AUTH

    assert cli("account", "delete", user_id).returncode == ExitCode.USAGE  # no terminal, no --yes
    done = cli("account", "delete", user_id, "--yes")
    assert done.returncode == 0, done.stderr
    assert "newcomer" not in [u["user_name"] for u in world["api"].get("/auth/list").json()["users"]]
    gone = cli("account", "delete", "newcomer", "--yes")
    assert gone.returncode == ExitCode.NOT_FOUND and "unknown user 'newcomer'" in one_error_line(gone)


# --- workers ----------------------------------------------------------------------------


def test_worker_update_changes_only_what_is_given(world):
    cli = world["cli"]
    worker_id = cli("worker", "create", "changing", "--provider", "fake", "--tool", "calculator",
                    "--model", "m1").stdout.strip()
    done = cli("worker", "update", worker_id, "--name", "changed", "--tool", "current_time",
               "--system-prompt", "Be kind.", "--json")
    assert done.returncode == 0, done.stderr
    stored = world["api"].get(f"/agent/worker/{worker_id}").json()
    assert json.loads(done.stdout) == {k: v for k, v in stored.items() if k != "message"}
    assert (stored["name"], stored["tools"], stored["system_prompt"], stored["model"]) == (
        "changed", ["current_time"], "Be kind.", "m1")
    done = cli("worker", "update", worker_id, "--default-model", "--no-tools")
    assert done.returncode == 0, done.stderr
    stored = world["api"].get(f"/agent/worker/{worker_id}").json()
    assert stored["model"] is None and stored["tools"] == []
    assert cli("worker", "update", worker_id).returncode == ExitCode.USAGE
    assert cli("worker", "update", worker_id, "--tool", "x", "--no-tools").returncode == ExitCode.USAGE
    bad = cli("worker", "update", worker_id, "--tool", "teleport")
    assert bad.returncode == ExitCode.USAGE and "teleport" in one_error_line(bad)
    cli("worker", "delete", worker_id)


# --- templates --------------------------------------------------------------------------


def _template_file(world, tmp_path, name: str = "three_step") -> str:
    body = json.loads((EXAMPLES / "three_step.json").read_text())
    body["name"] = name
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(body))
    return str(path)


def test_template_create_show_update_delete(world, tmp_path):
    cli = world["cli"]
    done = cli("template", "create", _template_file(world, tmp_path, "lifecycle"))
    assert done.returncode == 0, done.stderr
    template_id = done.stdout.strip()
    stored = world["api"].get(f"/workflow/template/{template_id}").json()["template"]
    assert stored["name"] == "lifecycle" and [s["id"] for s in stored["steps"]] == ["facts", "numbers", "report"]

    listed = json.loads(cli("template", "list", "--json").stdout)
    assert template_id in [t["template_id"] for t in listed]
    assert "lifecycle" in cli("template", "list").stdout
    assert json.loads(cli("template", "show", "lifecycle", "--json").stdout) == stored
    plain = cli("template", "show", template_id)
    assert plain.returncode == 0 and "report (worker=helper)" in plain.stdout and "after facts, numbers" in plain.stdout

    steps_only = tmp_path / "steps.json"
    steps_only.write_text(json.dumps({"description": "now with two steps", "steps": stored["steps"][:2]}))
    done = cli("template", "update", "lifecycle", str(steps_only))
    assert done.returncode == 0, done.stderr
    stored = world["api"].get(f"/workflow/template/{template_id}").json()["template"]
    assert stored["name"] == "lifecycle" and stored["description"] == "now with two steps"
    assert [s["id"] for s in stored["steps"]] == ["facts", "numbers"]

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"steps": [  # three kinds of problem, reported together
        {"id": "a", "agent": {"node": "planner"}, "prompt": "{{nope}}", "depends_on": ["b"]},
        {"id": "b", "agent": {"node": "planner"}, "prompt": "x", "depends_on": ["a"]},
        {"id": "b", "agent": {"node": "planner"}, "prompt": "y"}]}))
    done = cli("template", "update", template_id, str(broken))
    line = one_error_line(done)
    assert done.returncode == ExitCode.USAGE
    assert "unknown placeholder {{nope}}" in line and "cycle: a -> b -> a" in line
    assert "duplicate step id 'b'" in line

    done = cli("template", "delete", "lifecycle", "--yes")
    assert done.returncode == 0, done.stderr
    assert world["api"].get(f"/workflow/template/{template_id}").status_code == 404


def test_template_check_prints_every_problem_and_saves_nothing(world, tmp_path):
    cli = world["cli"]
    before = world["api"].get("/workflow/template").json()["templates"]
    broken = tmp_path / "check.json"
    broken.write_text(json.dumps({"name": "never-saved", "input_schema": {"type": "nope"}, "steps": [
        {"id": "a", "agent": {"worker": "not-mine"}, "prompt": "{{ colour }}", "when": "steps.b.output"},
        {"id": "b", "agent": {"human": True}, "prompt": "ok?", "depends_on": ["a"], "timeout_seconds": 0}]}))
    done = cli("template", "check", str(broken))
    assert done.returncode == ExitCode.USAGE
    lines = done.stdout.splitlines()
    fields = {line.split(":", 1)[0] for line in lines}
    assert fields == {"steps.0.agent.worker", "steps.0.prompt", "steps.0.when",
                      "steps.1.timeout_seconds", "input_schema.type"}, lines
    assert "steps.0.when: `steps.b.output` needs step 'b' in depends_on (directly or transitively)" in lines
    assert f"{broken}: 5 problems" in one_error_line(done)
    as_json = json.loads(cli("template", "check", str(broken), "--json").stdout)
    assert as_json["valid"] is False and len(as_json["problems"]) == 5
    good = cli("template", "check", _template_file(world, tmp_path, "fine"))
    assert good.returncode == 0 and good.stdout == "" and "no problems" in good.stderr
    assert world["api"].get("/workflow/template").json()["templates"] == before


def test_template_files_that_cannot_be_read_are_usage_errors(world, tmp_path):
    cli = world["cli"]
    for group in ("template", "workflow"):
        missing = cli(group, "create", "/missing.json")
        assert missing.returncode == ExitCode.USAGE and "no such file: /missing.json" in one_error_line(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    done = cli("template", "create", str(bad))
    assert done.returncode == ExitCode.USAGE and "is not valid JSON" in one_error_line(done)
    bad.write_text("[1, 2]")
    done = cli("template", "create", str(bad))
    assert done.returncode == ExitCode.USAGE and "JSON object" in one_error_line(done)


# --- runs -------------------------------------------------------------------------------


def test_run_needs_no_input_and_takes_a_template_name(world):
    cli = world["cli"]
    done = cli("workflow", "run", "three_step", "--watch")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run ") and lines[-1].startswith("run succeeded")
    assert "    Echo: List the key facts in: " in lines  # {{input}} rendered as the empty string
    assert "started run" not in done.stderr  # the run is named once, by the view
    trace_id = lines[0].split()[1]
    run = world["api"].get(f"/workflow/run/{trace_id}").json()
    assert run["input"] == "" and run["template_name"] == "three_step"

    events = json.loads(cli("workflow", "events", trace_id, "--after", "2").stdout)
    stored = world["api"].get(f"/workflow/run/{trace_id}/events", params={"after": 2}).json()["events"]
    assert events == stored and events[0]["seq"] == 3


def test_list_runs_limit(world):
    cli = world["cli"]
    for _ in range(2):
        trace_id = cli("workflow", "run", "three_step").stdout.strip()
        wait_status(world, trace_id, {"succeeded"})
    body = json.loads(cli("workflow", "list", "runs", "--limit", "1", "--json").stdout)
    assert len(body["runs"]) == 1 and body["runs"][0]["trace_id"] == trace_id


def test_follow_run_example_honours_orchestra_port_and_says_when_it_cannot_connect(world):
    import os
    import subprocess
    import sys

    from tests.conftest import free_port

    script = EXAMPLES.parent / "follow_run.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
    done = subprocess.run([sys.executable, str(script), "--template", world["templates"]["three_step"]["template_id"],
                           "--input", "x"], env={**env, "ORCHESTRA_PORT": str(world["server"].port),
                                                 "ORCHESTRA_TOKEN": world["token"]},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("run ")
    lines = done.stdout.splitlines()
    assert any(line.split()[1:2] == ["run_finished"] for line in lines)
    # Columns hold on multi-line text: a line is an event (seq, kind) or indented under its text.
    events = [line for line in lines[1:] if re.match(r"^ *\d+ [a-z_]+( |$)", line)]
    assert events and all(line in events or line.startswith(" " * 22) for line in lines[1:]), done.stdout
    assert "\n" + " " * 22 + "Facts: " in done.stdout  # the report's prompt has several lines
    port = free_port()
    done = subprocess.run([sys.executable, str(script), "--template", "t"], env={**env, "ORCHESTRA_PORT": str(port)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"cannot reach the server at http://127.0.0.1:{port} (connection refused); "
                                   "is it running? (--server, ORCHESTRA_SERVER or ORCHESTRA_PORT)")


# --- files ------------------------------------------------------------------------------


def test_file_upload_list_download_delete(world, tmp_path):
    cli = world["cli"]
    notes = tmp_path / "notes.txt"
    notes.write_text("first line\nsecond line\n")
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 40)
    done = cli("file", "upload", str(notes), str(data))
    assert done.returncode == 0, done.stderr
    ids = done.stdout.split()
    assert len(ids) == 2
    listed = json.loads(cli("file", "list", "--json").stdout)
    assert listed == world["api"].get("/adapter/client/upload").json()["files"]
    by_id = {f["file_id"]: f for f in listed}
    assert by_id[ids[0]]["filename"] == "notes.txt" and by_id[ids[0]]["size"] == notes.stat().st_size
    assert by_id[ids[1]]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert "notes.txt" in cli("file", "list").stdout

    out = tmp_path / "out"
    out.mkdir()
    done = cli("file", "download", ids[1], "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert (out / "data.bin").read_bytes() == data.read_bytes()
    again = cli("file", "download", ids[1], "--output", str(out))
    assert again.returncode == ExitCode.USAGE and "--force" in one_error_line(again)
    assert cli("file", "download", ids[1], "--output", str(out), "--force").returncode == 0
    piped = cli("file", "download", ids[0], "--output", "-")
    assert piped.returncode == 0 and piped.stdout == notes.read_text()

    assert cli("file", "upload", str(tmp_path / "absent.txt")).returncode == ExitCode.USAGE
    done = cli("file", "delete", ids[0], "--yes")
    assert done.returncode == 0, done.stderr
    assert world["api"].get(f"/adapter/client/upload/{ids[0]}").status_code == 404
    gone = cli("file", "download", ids[0], "--output", str(tmp_path / "x"))
    assert gone.returncode == ExitCode.NOT_FOUND and not (tmp_path / "x").exists()

    trace_id = cli("workflow", "run", "three_step", "--file", ids[1]).stdout.strip()
    assert world["api"].get(f"/workflow/run/{trace_id}").json()["files"] == [
        {"file_id": ids[1], "filename": "data.bin"}]
    wait_status(world, trace_id, {"succeeded"})


def test_follow_run_example_names_the_tool_of_a_call_and_its_result():
    import importlib.util

    spec = importlib.util.spec_from_file_location("follow_run", EXAMPLES.parent / "follow_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    call = {"step_id": "numbers", "call_id": "c1", "name": "calculator", "arguments": {"expression": "12*7+1"}}
    assert module.line("5", "tool_call", call) == '   5 tool_call        [numbers] calculator({"expression": "12*7+1"})'
    result = {"step_id": "numbers", "call_id": "c1", "name": "calculator", "result": "85"}
    assert module.line("6", "tool_result", result) == "   6 tool_result      [numbers] calculator → 85"


def test_json_input_json_replies_and_retry_from_the_command_line(world, tmp_path):
    """`workflow run --input-json`, `workflow reply --json-content`, `workflow retry`."""
    cli, api = world["cli"], world["api"]
    body = json.loads((EXAMPLES / "review_approval.json").read_text())
    path = tmp_path / "review.json"
    path.write_text(json.dumps(body))
    assert cli("template", "check", str(path)).returncode == 0
    template_id = cli("template", "create", str(path)).stdout.strip()
    bad = cli("workflow", "run", template_id, "--input-json", "--input", "{nope")
    assert bad.returncode == ExitCode.USAGE and "--input is not JSON" in one_error_line(bad)
    done = cli("workflow", "run", template_id, "--input-json", "--input", '{"topic": "tea"}')
    assert done.returncode == 0, done.stderr
    trace_id = done.stdout.strip()
    run = wait_status(world, trace_id, {"waiting_reply"})
    assert api.get(f"/workflow/run/{trace_id}").json()["input"] == {"topic": "tea"}
    wrong = cli("workflow", "reply", trace_id, '{"approved": "yes"}', "--json-content")
    assert wrong.returncode == ExitCode.USAGE and "content.approved" in one_error_line(wrong)
    ok = cli("workflow", "reply", trace_id, '{"approved": false}', "--json-content")
    assert ok.returncode == 0, ok.stderr
    run = wait_status(world, trace_id, {"succeeded", "failed"})
    steps = {s["step_id"]: s for s in run["steps"]}
    assert steps["approve"]["output"] == {"approved": False} and steps["publish"]["status"] == "skipped"
    assert cli("workflow", "retry", trace_id).returncode == ExitCode.CONFLICT  # it succeeded
    cancelled = cli("workflow", "run", template_id, "--input-json", "--input", '{"topic": "cake"}').stdout.strip()
    wait_status(world, cancelled, {"waiting_reply"})
    assert api.post(f"/workflow/cancel/{cancelled}").status_code == 200
    wait_status(world, cancelled, {"cancelled"})
    again = cli("workflow", "retry", cancelled, "--json")
    assert again.returncode == 0, again.stderr
    new_id = json.loads(again.stdout)["trace_id"]
    retried = wait_status(world, new_id, {"waiting_reply"})
    assert retried["retry_of"] == cancelled
    assert {s["step_id"]: s["reused"] for s in retried["steps"]} == {
        "draft": True, "review": True, "approve": False, "publish": False}
