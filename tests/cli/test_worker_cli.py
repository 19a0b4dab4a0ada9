"""`orchestra worker …` against a real server process (workers stored through the API)."""

from __future__ import annotations

import json

import httpx
import pytest

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import ClientCLI, api_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A server with a provider named `fake` (and the harness's worker); a CLI logged in as root."""
    with api_world(tmp_path_factory) as info:
        yield info


def stored(world, worker_id: str) -> httpx.Response:
    return world["api"].get(f"/agent/worker/{worker_id}")


def test_create_by_provider_id_prints_only_the_id_and_stores_every_field(world):
    done = world["cli"]("worker", "create", "analyst", "--provider", world["provider_id"],
                        "--model", "other-model", "--tool", "calculator", "--tool", "current_time",
                        "--system-prompt", "Be brief.", "--description", "does sums")
    assert done.returncode == 0, done.stderr
    worker_id = done.stdout.strip()
    assert done.stdout == worker_id + "\n" and len(worker_id) == 36
    assert "✓" in done.stderr and worker_id in done.stderr
    body = stored(world, worker_id).json()
    assert body["name"] == "analyst" and body["provider_id"] == world["provider_id"]
    assert body["model"] == "other-model"
    assert body["tools"] == ["calculator", "current_time"]
    assert body["system_prompt"] == "Be brief." and body["description"] == "does sums"
    assert body["bound_skill"] is None


def test_create_by_provider_name_resolves_it(world):
    done = world["cli"]("worker", "create", "named", "--provider", "fake", "--tool", "calculator")
    assert done.returncode == 0, done.stderr
    body = stored(world, done.stdout.strip()).json()
    assert body["provider_id"] == world["provider_id"] and body["tools"] == ["calculator"]
    assert body["model"] is None


def test_list_json_show_and_delete(world):
    cli = world["cli"]
    worker_id = cli("worker", "create", "short-lived", "--provider", "fake").stdout.strip()

    listed = cli("worker", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    workers = json.loads(listed.stdout)
    api_ids = [w["worker_id"] for w in world["api"].get("/agent/worker").json()["workers"]]
    assert [w["worker_id"] for w in workers] == api_ids
    assert worker_id in api_ids and world["worker_id"] in api_ids
    assert all("message" not in w for w in workers)

    table = cli("worker", "list")
    assert table.returncode == 0 and worker_id in table.stdout and "short-lived" in table.stdout

    shown = cli("worker", "show", worker_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {k: v for k, v in stored(world, worker_id).json().items()
                                        if k != "message"}
    plain = cli("worker", "show", worker_id)
    assert plain.returncode == 0 and f"worker_id: {worker_id}" in plain.stdout
    assert "provider_name: fake" in plain.stdout

    deleted = cli("worker", "delete", worker_id)
    assert deleted.returncode == 0, deleted.stderr
    assert "✓" in deleted.stderr and worker_id in deleted.stderr
    assert stored(world, worker_id).status_code == 404

    again = cli("worker", "show", worker_id)
    assert again.returncode == ExitCode.NOT_FOUND
    assert again.stdout == "" and len(again.stderr.strip().splitlines()) == 1
    assert again.stderr.startswith("error: ")
    gone = cli("worker", "delete", worker_id)
    assert gone.returncode == ExitCode.NOT_FOUND and len(gone.stderr.strip().splitlines()) == 1


def test_unknown_provider_name_is_one_line_and_nothing_is_created(world):
    before = len(world["api"].get("/agent/worker").json()["workers"])
    done = world["cli"]("worker", "create", "orphan", "--provider", "no-such-provider")
    assert done.returncode == ExitCode.USAGE
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown provider 'no-such-provider'" in lines[0]
    assert len(world["api"].get("/agent/worker").json()["workers"]) == before


def test_unknown_tool_shows_the_servers_422_message_on_one_line(world):
    done = world["cli"]("worker", "create", "bad-tools", "--provider", "fake", "--tool", "teleport")
    assert done.returncode == ExitCode.USAGE
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and "unknown tool 'teleport'" in lines[0]
    names = [w["name"] for w in world["api"].get("/agent/worker").json()["workers"]]
    assert "bad-tools" not in names


def test_unknown_skill_is_the_servers_422(world):
    done = world["cli"]("worker", "create", "skilled", "--provider", "fake", "--skill", "nope")
    assert done.returncode == ExitCode.USAGE
    assert "unknown skill 'nope'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_explicit_server_and_token_without_a_login(world, tmp_path):
    fresh = ClientCLI(tmp_path)
    done = fresh("worker", "list", "--json", "--server", world["server"].base_url, "--token", world["token"])
    assert done.returncode == 0, done.stderr
    assert world["worker_id"] in [w["worker_id"] for w in json.loads(done.stdout)]
    bad = fresh("worker", "list", "--server", world["server"].base_url, "--token", "not-a-token")
    assert bad.returncode == ExitCode.AUTH and len(bad.stderr.strip().splitlines()) == 1
    nothing = fresh("worker", "list")
    assert nothing.returncode == ExitCode.USAGE and "no server given" in nothing.stderr


def test_show_update_and_delete_take_a_workers_name(world):
    """Issue 29, item 4: `worker update plain` works by name, like `--provider fake`; an
    unknown name is one line naming the workers there are."""
    cli = world["cli"]
    made = cli("worker", "create", "plain", "--provider", "fake")
    assert made.returncode == 0, made.stderr
    worker_id = made.stdout.strip()
    updated = cli("worker", "update", "plain", "--description", "by name")
    assert updated.returncode == 0, updated.stderr
    assert stored(world, worker_id).json()["description"] == "by name"
    shown = json.loads(cli("worker", "show", "plain", "--json").stdout)
    assert shown["worker_id"] == worker_id
    missing = cli("worker", "update", "no-such-worker", "--description", "x")
    assert missing.returncode == ExitCode.NOT_FOUND
    line = [x for x in missing.stderr.splitlines() if x.strip()]
    assert len(line) == 1 and "unknown worker 'no-such-worker'" in line[0] and "plain" in line[0]
    assert cli("worker", "delete", "plain").returncode == 0
    assert stored(world, worker_id).status_code == 404
