"""`--workspace` on every command (SPEC §16, "CLI"): `worker` and `subscription` create in
the workspace named and list only its items; the root's `orchestra --workspace` and
$ORCHESTRA_WORKSPACE do the same, a command's own option winning over the root's, the
root's over the environment; names are looked up in the workspace; an unknown workspace
is one line and exit 3; and every command accepts the option. Checked against what the
API then holds, through a real server."""

from __future__ import annotations

import json

import httpx
import pytest

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import api_token, api_world, make_user, one_error_line

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A server with a provider `fake`; a CLI logged in as root; a team workspace `team`."""
    with api_world(tmp_path_factory) as info:
        made = info["api"].post("/workspace", json={"name": "team"})
        assert made.status_code == 201, made.text
        info["team"] = made.json()["workspace_id"]
        [personal] = [w for w in info["api"].get("/workspace").json()["workspaces"] if w["personal"]]
        info["personal"] = personal["workspace_id"]
        yield info


@pytest.fixture(scope="module")
def bob(world):
    """An httpx client of `bob`, a plain user who is an editor of `team`."""
    make_user(world["server"], "bob", "USER")
    added = world["api"].post(f"/workspace/{world['team']}/member", json={"user_name": "bob", "role": "editor"})
    assert added.status_code == 201, added.text
    with httpx.Client(base_url=f"{world['server'].base_url}/api/v1",
                      headers={"Authorization": f"Bearer {api_token(world['server'], 'bob')}"}) as client:
        yield client


def created_id(done) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def listed(world, *args: str, env: dict | None = None) -> list[str]:
    done = world["cli"](*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    return sorted(r.get("worker_id") or r.get("subscription_id") for r in rows)


def test_worker_create_and_list_in_a_workspace(world):
    cli, api = world["cli"], world["api"]
    team_worker = created_id(cli("worker", "create", "teamhand", "--provider", "fake", "--workspace", "team"))
    by_id = created_id(cli("worker", "create", "teamhand2", "--provider", "fake", "--workspace", world["team"]))
    mine = created_id(cli("worker", "create", "minehand", "--provider", "fake"))
    try:
        assert api.get(f"/agent/worker/{team_worker}").json()["workspace_id"] == world["team"]
        assert api.get(f"/agent/worker/{by_id}").json()["workspace_id"] == world["team"]
        assert api.get(f"/agent/worker/{mine}").json()["workspace_id"] == world["personal"]
        team_only = sorted([team_worker, by_id])
        assert listed(world, "worker", "list", "--workspace", "team") == team_only
        assert listed(world, "worker", "list", env={"ORCHESTRA_WORKSPACE": "team"}) == team_only
        assert listed(world, "--workspace", "team", "worker", "list") == team_only
        everything = listed(world, "worker", "list")
        assert set(team_only) | {mine, world["worker_id"]} <= set(everything)
        assert mine in listed(world, "worker", "list", "--workspace", world["personal"])
        # The root's option and the environment reach a creation too.
        via_env = created_id(cli("worker", "create", "envhand", "--provider", "fake",
                                 env={"ORCHESTRA_WORKSPACE": "team"}))
        via_root = created_id(cli("--workspace", "team", "worker", "create", "roothand", "--provider", "fake"))
        for worker_id in (via_env, via_root):
            assert api.get(f"/agent/worker/{worker_id}").json()["workspace_id"] == world["team"]
            assert api.delete(f"/agent/worker/{worker_id}").status_code == 200
    finally:
        for worker_id in (team_worker, by_id, mine):
            api.delete(f"/agent/worker/{worker_id}")


def test_the_command_option_beats_the_root_one_which_beats_the_environment(world):
    cli = world["cli"]
    team_worker = created_id(cli("worker", "create", "ordered", "--provider", "fake", "--workspace", "team"))
    try:
        root_over_env = listed(world, "--workspace", "team", "worker", "list",
                               env={"ORCHESTRA_WORKSPACE": "no such team"})
        command_over_root = listed(world, "--workspace", "no such team", "worker", "list", "--workspace", "team")
        command_over_env = listed(world, "worker", "list", "--workspace", "team",
                                  env={"ORCHESTRA_WORKSPACE": world["personal"]})
        assert root_over_env == command_over_root == command_over_env == [team_worker]
    finally:
        world["api"].delete(f"/agent/worker/{team_worker}")


def test_a_worker_name_is_looked_up_in_the_workspace(world, bob):
    """Names are unique per user, so a team's `twin` is another member's: `--workspace`
    picks which of the two `twin`s a name means."""
    cli, api = world["cli"], world["api"]
    mine = created_id(cli("worker", "create", "twin", "--provider", "fake"))
    made = bob.post("/agent/worker", json={"name": "twin", "provider_id": world["provider_id"],
                                           "workspace_id": world["team"]})
    assert made.status_code == 201, made.text
    theirs = made.json()["worker_id"]
    try:
        shown = cli("worker", "show", "twin", "--workspace", "team", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["worker_id"] == theirs
        assert json.loads(cli("worker", "show", "twin", "--workspace", world["personal"], "--json").stdout)[
            "worker_id"] == mine
        updated = cli("worker", "update", "twin", "--description", "the team's", "--workspace", "team")
        assert updated.returncode == 0, updated.stderr
        assert api.get(f"/agent/worker/{theirs}").json()["description"] == "the team's"
        assert api.get(f"/agent/worker/{mine}").json()["description"] != "the team's"
        deleted = cli("worker", "delete", "twin", env={"ORCHESTRA_WORKSPACE": "team"})
        assert deleted.returncode == 0, deleted.stderr
        assert api.get(f"/agent/worker/{theirs}").status_code == 404
        assert api.get(f"/agent/worker/{mine}").status_code == 200
        elsewhere = cli("worker", "show", "twin", "--workspace", "team")
        assert elsewhere.returncode == ExitCode.NOT_FOUND and "unknown worker" in one_error_line(elsewhere)
    finally:
        for worker_id in (mine, theirs):
            api.delete(f"/agent/worker/{worker_id}")


def test_subscription_add_and_list_in_a_workspace(world):
    cli, api = world["cli"], world["api"]
    added = cli("subscription", "add", "http://127.0.0.1:9/team", "--workspace", "team", "--json")
    assert added.returncode == 0, added.stderr
    team_sub = json.loads(added.stdout)["subscription_id"]
    mine = cli("subscription", "add", "http://127.0.0.1:9/mine", "--json")
    assert mine.returncode == 0, mine.stderr
    my_sub = json.loads(mine.stdout)["subscription_id"]
    try:
        subs = {s["subscription_id"]: s for s in api.get("/workflow/subscription").json()["subscriptions"]}
        assert subs[team_sub]["workspace_id"] == world["team"]
        assert subs[my_sub]["workspace_id"] == world["personal"]
        assert listed(world, "subscription", "list", "--workspace", "team") == [team_sub]
        assert listed(world, "subscription", "list", env={"ORCHESTRA_WORKSPACE": "team"}) == [team_sub]
        assert listed(world, "--workspace", "team", "subscription", "list") == [team_sub]
        assert sorted([team_sub, my_sub]) == listed(world, "subscription", "list")
    finally:
        for sub in (team_sub, my_sub):
            api.delete(f"/workflow/subscription/{sub}")


def test_a_template_name_is_looked_up_in_the_workspace(world, bob, tmp_path):
    cli, api = world["cli"], world["api"]
    template = {"name": "twin-template", "steps": [{"id": "a", "code": {"source": "1 + 1"}}]}
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(template))
    mine = created_id(cli("template", "create", str(path)))
    made = bob.post("/workflow/template", json={**template, "workspace_id": world["team"]})
    assert made.status_code == 201, made.text
    theirs = made.json()["template_id"]
    path.write_text(json.dumps({**template, "name": "team-template"}))
    by_workflow_create = created_id(cli("workflow", "create", str(path), "--workspace", "team"))
    try:
        assert api.get(f"/workflow/template/{by_workflow_create}").json()["template"]["workspace_id"] == \
            world["team"]
        shown = cli("template", "show", "twin-template", "--workspace", "team", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["template_id"] == theirs
        versions = cli("--workspace", "team", "template", "versions", "twin-template", "--json")
        assert versions.returncode == 0, versions.stderr
        deleted = cli("template", "delete", "twin-template", "--yes", "--workspace", "team")
        assert deleted.returncode == 0, deleted.stderr
        assert api.get(f"/workflow/template/{theirs}").status_code == 404
        assert api.get(f"/workflow/template/{mine}").status_code == 200
    finally:
        for template_id in (mine, theirs, by_workflow_create):
            api.delete(f"/workflow/template/{template_id}")


@pytest.mark.parametrize("args, env", [
    (("worker", "list", "--workspace", "no such team"), None),
    (("worker", "create", "x", "--provider", "fake", "--workspace", "no such team"), None),
    (("worker", "list"), {"ORCHESTRA_WORKSPACE": "no such team"}),
    (("--workspace", "no such team", "worker", "list"), None),
    (("subscription", "add", "http://127.0.0.1:9/x", "--workspace", "no such team"), None),
    (("subscription", "list"), {"ORCHESTRA_WORKSPACE": "no such team"}),
    (("template", "show", "three_step", "--workspace", "no such team"), None),
])
def test_an_unknown_workspace_is_one_line_and_exit_3(world, args, env):
    before = world["api"].get("/agent/worker").json()["workers"]
    done = world["cli"](*args, env=env)
    assert done.returncode == ExitCode.NOT_FOUND, done.stderr
    assert "no workspace of yours" in one_error_line(done) and "no such team" in done.stderr
    assert done.stdout == ""
    assert world["api"].get("/agent/worker").json()["workers"] == before


def test_every_command_takes_the_option(world):
    """Commands whose objects are instance-wide (system nodes) accept it and say in
    --help that they do not use it; the answer is the same as without it. Providers and
    the tool catalog are no longer such objects (a workspace has its own providers and
    MCP servers, SPEC §16): `provider list` with the option lists that workspace's own
    providers, without it the instance-wide ones; `tool list` with it lists the tools
    that workspace's workers may use."""
    cli, api = world["cli"], world["api"]
    args = ("node", "list", "--json")
    plain = cli(*args)
    assert plain.returncode == 0, plain.stderr
    for extra, env in (((*args, "--workspace", "team"), None), (args, {"ORCHESTRA_WORKSPACE": "team"}),
                       (("--workspace", "team", *args), None)):
        done = cli(*extra, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == json.loads(plain.stdout)
    helped = cli("node", "list", "--help", env={"COLUMNS": "300"})
    assert helped.returncode == 0 and "--workspace" in helped.stdout and "does not use it" in helped.stdout

    made = api.post("/provider", json={"name": "team-only", "provider": "deepseek", "model_id": "deepseek-chat",
                                       "workspace_id": world["team"]})
    assert made.status_code == 201, made.text
    try:
        args = ("provider", "list", "--json")
        wide = json.loads(cli(*args).stdout)
        assert wide and all(p["workspace_id"] is None for p in wide)
        assert made.json()["provider_id"] not in [p["provider_id"] for p in wide]
        for extra, env in (((*args, "--workspace", "team"), None), (args, {"ORCHESTRA_WORKSPACE": "team"}),
                           (("--workspace", "team", *args), None)):
            done = cli(*extra, env=env)
            assert done.returncode == 0, done.stderr
            assert [p["provider_id"] for p in json.loads(done.stdout)] == [made.json()["provider_id"]]
    finally:
        api.delete(f"/provider/{made.json()['provider_id']}", params={"workspace_id": world["team"]})
    tools = cli("tool", "list", "--workspace", "team", "--json")
    assert tools.returncode == 0, tools.stderr
    assert json.loads(tools.stdout) == api.get("/resource/tool", params={"workspace_id": world["team"]}).json()["tools"]
    for command in ("provider", "tool", "mcp", "worker"):
        helped = cli(command, "list", "--help", env={"COLUMNS": "300"})
        assert "--workspace" in helped.stdout and "does not use it" not in helped.stdout


def test_every_command_in_the_tree_has_a_workspace_option():
    """The whole command tree, as `orchestra` builds it: each command has `--workspace`
    but `workspace delete`, whose argument is the workspace."""
    from orchestra.cli import command

    missing = []

    def walk(node, path):
        if hasattr(node, "commands"):
            for name, sub in node.commands.items():
                walk(sub, [*path, name])
        elif not any("--workspace" in getattr(p, "opts", ()) for p in node.params):
            missing.append(" ".join(path))

    walk(command(), [])
    assert missing == ["workspace delete"]
    assert any("--workspace" in p.opts for p in command().params)
