"""`orchestra secret set | hosts | list | delete` through a real server: the value comes
from stdin (never argv), is never printed, a new secret needs its hosts, and set
replaces an existing secret's value (keeping its hosts unless new ones are given)."""

from __future__ import annotations

import pytest

from tests.cli.cli_harness import api_world

VALUE = "sk-cli-secret-0123456789wxyz"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


def test_secret_set_list_replace_delete(world):
    cli = world["cli"]
    no_hosts = cli("secret", "set", "CRM_KEY", "--value-stdin", input=VALUE + "\n")
    assert no_hosts.returncode != 0 and "--host" in no_hosts.stderr and VALUE not in no_hosts.stderr
    assert world["api"].get("/resource/secret").json()["secrets"] == []
    done = cli("secret", "set", "CRM_KEY", "--value-stdin", "--host", "crm.example.com", input=VALUE + "\n")
    assert done.returncode == 0, done.stderr
    assert VALUE not in done.stdout + done.stderr and "…wxyz" in done.stderr and "crm.example.com" in done.stderr
    listed = cli("secret", "list", "--json")
    assert listed.returncode == 0 and VALUE not in listed.stdout
    assert '"CRM_KEY"' in listed.stdout and "…wxyz" in listed.stdout
    again = cli("secret", "set", "CRM_KEY", "--value-stdin", input="another-value-1234\n")
    assert again.returncode == 0 and "replaced" in again.stderr
    assert [(s["hint"], s["hosts"]) for s in world["api"].get("/resource/secret").json()["secrets"]] == [
        ("…1234", ["crm.example.com"])]
    moved = cli("secret", "hosts", "CRM_KEY", "--host", "*.Example.com:443", "--host", "[::1]")
    assert moved.returncode == 0, moved.stderr
    assert world["api"].get("/resource/secret").json()["secrets"][0]["hosts"] == ["*.example.com:443", "[::1]"]
    assert "*.example.com:443" in cli("secret", "list").stdout
    refused = cli("secret", "hosts", "CRM_KEY", "--host", "not a host")
    assert refused.returncode != 0 and "hosts" in refused.stderr
    bad = cli("secret", "set", "1bad", "--value-stdin", "--host", "x.example", input=VALUE + "\n")
    assert bad.returncode != 0 and "name" in bad.stderr and VALUE not in bad.stderr
    gone = cli("secret", "delete", "CRM_KEY", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert world["api"].get("/resource/secret").json()["secrets"] == []
    missing = cli("secret", "delete", "CRM_KEY", "--yes")
    assert missing.returncode != 0 and "No secret" in missing.stderr


def test_secret_commands_take_a_workspace(world):
    cli, api = world["cli"], world["api"]
    made = api.post("/workspace", json={"name": "secretteam"})
    assert made.status_code == 201, made.text
    wid = made.json()["workspace_id"]
    done = cli("secret", "set", "TEAM_KEY", "--value-stdin", "--host", "team.example", "--workspace", "secretteam",
               input=VALUE + "\n")
    assert done.returncode == 0, done.stderr
    [stored] = api.get("/resource/secret", params={"workspace_id": wid}).json()["secrets"]
    assert (stored["name"], stored["workspace_id"]) == ("TEAM_KEY", wid)
    assert "TEAM_KEY" not in [s["name"] for s in api.get("/resource/secret").json()["secrets"]]
    listed = cli("secret", "list", "--workspace", wid, "--json")
    assert listed.returncode == 0 and '"TEAM_KEY"' in listed.stdout and VALUE not in listed.stdout
    assert '"TEAM_KEY"' not in cli("secret", "list", "--json").stdout  # the instance-wide ones
    moved = cli("secret", "hosts", "TEAM_KEY", "--host", "other.example", "--workspace", "secretteam")
    assert moved.returncode == 0, moved.stderr
    assert api.get("/resource/secret", params={"workspace_id": wid}).json()["secrets"][0]["hosts"] == ["other.example"]
    assert cli("secret", "delete", "TEAM_KEY", "--yes").returncode != 0  # not an instance-wide secret
    gone = cli("secret", "delete", "TEAM_KEY", "--yes", "--workspace", "secretteam")
    assert gone.returncode == 0, gone.stderr
    assert api.get("/resource/secret", params={"workspace_id": wid}).json()["secrets"] == []
