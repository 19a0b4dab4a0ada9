"""`orchestra key` and `orchestra hook` through a real server, checked against what the
API then holds: secrets printed once on stdout, never listed; revoke and delete work."""

from __future__ import annotations

import datetime as dt
import json
import time

import httpx
import pytest
from standardwebhooks import Webhook

from tests.cli.cli_harness import api_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


def test_key_create_list_revoke(world):
    cli, api = world["cli"], world["api"]
    template_id = world["templates"]["with_human"]["template_id"]
    done = cli("key", "create", "nightly", "--scope", "run:start", "-s", "run:read", "--template", template_id)
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert secret.startswith("orc_") and "not be shown again" in done.stderr
    [info] = api.get("/auth/key").json()["keys"]
    assert info["name"] == "nightly" and info["templates"] == [template_id]
    base = world["server"].base_url + "/api/v1"
    used = httpx.get(f"{base}/workflow/run", headers={"Authorization": f"Bearer {secret}"})
    assert used.status_code == 200
    listed = cli("key", "list")
    assert listed.returncode == 0 and "nightly" in listed.stdout and secret not in listed.stdout
    assert f"orc_{info['prefix']}" in listed.stdout
    as_json = json.loads(cli("key", "list", "--json").stdout)
    assert [k["key_id"] for k in as_json] == [info["key_id"]] and "key" not in as_json[0]
    done = cli("key", "revoke", "nightly", "--yes")
    assert done.returncode == 0, done.stderr
    assert api.get("/auth/key").json()["keys"] == []
    refused = httpx.get(f"{base}/workflow/run", headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401
    bad = cli("key", "create", "x", "--scope", "root")
    assert bad.returncode != 0 and "scopes" in bad.stderr


def test_key_create_and_list_in_a_workspace(world):
    """`key create --workspace NAME` makes the key there (SPEC §16); `key list --workspace`
    lists that workspace's keys only; every key shows its workspace."""
    cli, api = world["cli"], world["api"]
    made = api.post("/workspace", json={"name": "keyteam"})
    assert made.status_code == 201, made.text
    workspace_id = made.json()["workspace_id"]
    done = cli("key", "create", "teamkey", "-s", "run:read", "--workspace", "keyteam")
    assert done.returncode == 0, done.stderr
    personal = cli("key", "create", "mine", "-s", "run:read")
    assert personal.returncode == 0, personal.stderr
    try:
        [info] = api.get("/auth/key", params={"workspace_id": workspace_id}).json()["keys"]
        assert info["name"] == "teamkey" and info["workspace_id"] == workspace_id
        as_json = json.loads(cli("key", "list", "--workspace", workspace_id, "--json").stdout)
        assert [k["key_id"] for k in as_json] == [info["key_id"]]
        assert {k["name"]: k["workspace_id"] for k in json.loads(cli("key", "list", "--json").stdout)}[
            "teamkey"] == workspace_id and cli("key", "list").returncode == 0
        unknown = cli("key", "create", "x", "-s", "run:read", "--workspace", "no such team")
        assert unknown.returncode != 0 and "no workspace of yours" in unknown.stderr
    finally:
        for key in api.get("/auth/key").json()["keys"]:
            api.delete(f"/auth/key/{key['key_id']}")
        api.delete(f"/workspace/{workspace_id}")


def test_hook_create_list_show_delete(world):
    cli, api = world["cli"], world["api"]
    template = world["templates"]["with_human"]
    done = cli("hook", "create", template["template"]["name"], "--input", "body.topic")
    assert done.returncode == 0, done.stderr
    url, secret = done.stdout.split()
    assert secret.startswith("whsec_") and "/api/v1/hooks/" in url
    [hook] = api.get("/workflow/hook").json()["hooks"]
    assert hook["url"] == url and hook["input"] == "body.topic"
    assert secret not in cli("hook", "list").stdout and hook["hook_id"] in cli("hook", "list").stdout
    shown = json.loads(cli("hook", "show", hook["hook_id"], "--json").stdout)
    assert shown == hook
    body = b'{"topic": "tides"}'
    when = dt.datetime.fromtimestamp(time.time(), dt.UTC)
    headers = {"webhook-id": "m1", "webhook-timestamp": str(int(when.timestamp())),
               "webhook-signature": Webhook(secret).sign("m1", when, body.decode()),
               "content-type": "application/json"}
    called = httpx.post(url, content=body, headers=headers)
    assert called.status_code == 202, called.text
    run = api.get(f"/workflow/run/{called.json()['trace_id']}").json()
    assert run["input"] == "tides" and run["trigger"]["hook_id"] == hook["hook_id"]
    assert cli("hook", "delete", hook["hook_id"], "--yes").returncode == 0
    assert api.get("/workflow/hook").json()["hooks"] == []
    assert httpx.post(url, content=body, headers=headers).status_code == 404


def test_a_run_start_and_run_read_key_runs_a_template_by_id(world):
    """Issue 39, point 3: the docs' key (run:start, run:read) starts a run by template id
    from the CLI (no template list read first); a name says it needs template:read;
    `key create --template NAME` resolves the name, and an unknown one is said rightly."""
    from orchestra.cli.console import ExitCode
    from tests.cli.cli_harness import one_error_line

    cli, api = world["cli"], world["api"]
    template_id = world["templates"]["three_step"]["template_id"]
    done = cli("key", "create", "nightly report", "-s", "run:start", "-s", "run:read", "--template", "three_step")
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    try:
        [info] = [k for k in api.get("/auth/key").json()["keys"] if k["name"] == "nightly report"]
        assert info["templates"] == [template_id]  # the name was resolved to the id
        as_key = {"ORCHESTRA_TOKEN": key}
        ran = cli("workflow", "run", template_id, "--input", "tea", "--watch", env=as_key)
        assert ran.returncode == 0, ran.stderr
        assert "run succeeded" in ran.stdout
        by_name = cli("workflow", "run", "three_step", "--input", "tea", env=as_key)
        assert by_name.returncode == ExitCode.AUTH
        line = one_error_line(by_name)
        assert "'three_step' is a template name" in line and "'template:read'" in line, line
        assert "template_id" in line, line
        unknown = cli("key", "create", "other", "-s", "run:start", "--template", "nightly report")
        assert unknown.returncode == ExitCode.NOT_FOUND
        assert "unknown template 'nightly report'" in one_error_line(unknown)
        refused = api.post("/auth/key", json={"name": "other", "scopes": ["run:start"],
                                              "templates": ["nightly report"]})
        assert refused.status_code == 422
        assert "no template you may run has the template_id 'nightly report'" in refused.json()["message"]
    finally:
        for made in api.get("/auth/key").json()["keys"]:
            api.delete(f"/auth/key/{made['key_id']}")
