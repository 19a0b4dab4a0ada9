"""A team workspace on a real `orchestra serve` (SPEC §16), driven by the CLI and checked
over HTTP: its owner makes it and adds an editor, a runner and a viewer (`orchestra
workspace create`, `orchestra member add`); the editor saves a template there; the
runner starts and answers a run; the viewer reads both and may do nothing else; a user
outside it is told nothing."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.cli.cli_harness import PASSWORD, ClientCLI
from tests.conftest import ServerProcess
from tests.e2e.test_workflow_e2e import login

HUMAN = [{"id": "ask", "agent": {"human": True}, "prompt": "About {{input}}?"}]
START_SECONDS = 120


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("srv")).start(timeout=START_SECONDS)
    try:
        people = {name: login(server, name) for name in ("alice", "bob", "carol", "dave", "eve")}
        clis = {}
        for name in ("alice", "bob"):
            cli = ClientCLI(tmp_path_factory.mktemp(f"cli-{name}"))
            done = cli("login", "--server", server.base_url, "--user", name, "--password-stdin",
                       input=PASSWORD + "\n")
            assert done.returncode == 0, done.stderr
            clis[name] = cli
        with httpx.Client(base_url=f"{server.base_url}/api/v1", timeout=30) as http:
            yield {"server": server, "headers": people, "cli": clis, "http": http,
                   "tmp": tmp_path_factory.mktemp("files")}
    finally:
        server.stop()


def test_the_cli_makes_a_workspace_and_its_members(team):
    alice, http = team["cli"]["alice"], team["http"]
    done = alice("workspace", "create", "Research")
    assert done.returncode == 0, done.stderr
    workspace_id = done.stdout.strip()
    assert len(workspace_id) == 36 and "\n" not in workspace_id  # the id alone
    listed = json.loads(alice("workspace", "list", "--json").stdout)
    assert [(w["name"], w["role"], w["personal"]) for w in listed] == [
        ("alice", "owner", True), ("Research", "owner", False)]
    for user, role in (("bob", "editor"), ("carol", "runner"), ("dave", "viewer")):
        done = alice("member", "add", user, "--role", role, "--workspace", "Research")
        assert done.returncode == 0, done.stderr
    done = alice("member", "add", "ghost", "--role", "viewer", env={"ORCHESTRA_WORKSPACE": workspace_id})
    assert done.returncode == 3 and "ghost" in done.stderr  # 404 UserNotExistError
    members = json.loads(alice("member", "list", "--workspace", workspace_id, "--json").stdout)
    assert [(m["user_name"], m["role"]) for m in members] == [
        ("alice", "owner"), ("bob", "editor"), ("carol", "runner"), ("dave", "viewer")]
    assert "carol" in alice("member", "list", "--workspace", "Research").stdout
    served = http.get(f"/workspace/{workspace_id}/member", headers=team["headers"]["dave"]).json()
    assert served["members"] == members
    team["workspace_id"] = workspace_id


def research(team) -> str:
    """The "Research" workspace the CLI test made; made over HTTP when that test ran
    elsewhere or not at all (a worker of a parallel run may get this test alone)."""
    if "workspace_id" not in team:
        http, h = team["http"], team["headers"]
        made = http.post("/workspace", headers=h["alice"], json={"name": "Research"})
        assert made.status_code == 201, made.text
        workspace_id = made.json()["workspace_id"]
        for user, role in (("bob", "editor"), ("carol", "runner"), ("dave", "viewer")):
            added = http.post(f"/workspace/{workspace_id}/member", headers=h["alice"],
                              json={"user_name": user, "role": role})
            assert added.status_code == 201, added.text
        team["workspace_id"] = workspace_id
    return team["workspace_id"]


def test_a_team_schedule_and_the_team_audit_log_through_the_cli(team):
    """The editor schedules a workspace template with `--workspace`; a template of another
    workspace is refused (422 naming template_id); the owner reads the workspace's audit
    log (`audit list --workspace`), the editor may not (403)."""
    http, h, bob, alice = team["http"], team["headers"], team["cli"]["bob"], team["cli"]["alice"]
    workspace_id = research(team)
    made = http.post("/workflow/template", headers=h["bob"],
                     json={"name": "daily", "steps": HUMAN, "workspace_id": workspace_id})
    assert made.status_code == 201, made.text
    mine = http.post("/workflow/template", headers=h["bob"], json={"name": "own", "steps": HUMAN})
    done = bob("schedule", "add", made.json()["template_id"], "0 9 * * *", "--workspace", "Research", "--json")
    assert done.returncode == 0, done.stderr
    schedule = json.loads(done.stdout)
    assert schedule["workspace_id"] == workspace_id
    crossed = bob("schedule", "add", mine.json()["template_id"], "0 9 * * *", "--workspace", "Research")
    assert crossed.returncode != 0 and "template_id" in crossed.stderr
    listed = http.get("/workflow/schedule", params={"workspace_id": workspace_id}, headers=h["dave"]).json()
    assert [s["schedule_id"] for s in listed["schedules"]] == [schedule["schedule_id"]]
    assert http.get(f"/workflow/schedule/{schedule['schedule_id']}", headers=h["eve"]).status_code == 404
    assert http.delete(f"/workflow/schedule/{schedule['schedule_id']}", headers=h["bob"]).status_code == 200
    assert http.delete(f"/workflow/template/{made.json()['template_id']}", headers=h["bob"]).status_code == 200
    entries = json.loads(alice("audit", "list", "--workspace", "Research", "--json").stdout)
    actions = [e["action"] for e in reversed(entries)]
    assert actions[:4] == ["workspace.create", "member.add", "member.add", "member.add"]
    assert {e["workspace_id"] for e in entries} == {workspace_id}
    refused = bob("audit", "list", "--workspace", "Research")
    assert refused.returncode != 0 and "admin" in refused.stderr


def test_an_editor_a_runner_and_a_viewer_each_do_their_part(team):
    http, h = team["http"], team["headers"]
    workspace_id = research(team)
    # the editor saves a template into the workspace through the CLI, naming it by name
    spec = team["tmp"] / "ask.json"
    spec.write_text(json.dumps({"name": "ask", "steps": HUMAN}))
    done = team["cli"]["bob"]("template", "create", str(spec), "--workspace", "Research")
    assert done.returncode == 0, done.stderr
    template_id = done.stdout.strip()
    template = http.get(f"/workflow/template/{template_id}", headers=h["dave"]).json()["template"]
    assert template["workspace_id"] == workspace_id
    # the viewer may not start it (403 naming runner); an outsider is told nothing
    refused = http.post("/workflow/run", headers=h["dave"], json={"template_id": template_id, "input": "x"})
    assert refused.status_code == 403 and refused.json()["detail"]["role_needed"] == "runner"
    hidden = http.post("/workflow/run", headers=h["eve"], json={"template_id": template_id, "input": "x"})
    assert hidden.status_code == 404 and hidden.json()["error"] == "NotFoundError"
    # the runner starts and answers a run; it belongs to the workspace
    started = http.post("/workflow/run", headers=h["carol"], json={"template_id": template_id, "input": "tides"})
    assert started.status_code == 202, started.text
    trace_id = started.json()["trace_id"]
    deadline = time.monotonic() + 30
    while http.get(f"/workflow/run/{trace_id}", headers=h["carol"]).json()["status"] != "waiting_reply":
        assert time.monotonic() < deadline, "the run never asked its question"
        time.sleep(0.1)
    refused = http.post(f"/workflow/reply/{trace_id}", headers=h["dave"], json={"content": "no"})
    assert refused.status_code == 403, refused.text
    answered = http.post(f"/workflow/reply/{trace_id}", headers=h["carol"], json={"content": "yes"})
    assert answered.status_code == 200, answered.text
    while (run := http.get(f"/workflow/run/{trace_id}", headers=h["dave"]).json())["status"] != "succeeded":
        assert time.monotonic() < deadline, run
        time.sleep(0.1)
    assert run["workspace_id"] == workspace_id and run["owner_id"] != template["owner_id"]
    # the viewer lists them by workspace; the runner may not change the template
    runs = http.get("/workflow/run", params={"workspace_id": workspace_id}, headers=h["dave"]).json()["runs"]
    assert [r["trace_id"] for r in runs] == [trace_id]
    changed = http.put(f"/workflow/template/{template_id}", headers=h["carol"],
                       json={"name": "ask2", "steps": HUMAN})
    assert changed.status_code == 403 and changed.json()["detail"]["role_needed"] == "editor"
    assert http.get(f"/workflow/run/{trace_id}", headers=h["eve"]).status_code == 404
    assert http.get("/workflow/run", params={"workspace_id": workspace_id}, headers=h["eve"]).status_code == 404
    # the owner cannot delete it while... nothing is active now: deleting takes its runs along
    deleted = http.delete(f"/workspace/{workspace_id}", headers=h["alice"])
    assert deleted.status_code == 200, deleted.text
    assert http.get(f"/workflow/run/{trace_id}", headers=h["carol"]).status_code == 404
