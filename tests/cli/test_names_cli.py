"""Names, not ids (issue 39, point 7): `usage --by template`, `key list`, `subscription
list` and `template versions` show names; `workflow show` shows an open question and a
child run that waits; a provider's error names the provider."""

from __future__ import annotations

import time

import pytest

from tests.cli.cli_harness import api_world

CHILD = {"name": "names_child", "steps": [{"id": "ask", "agent": {"human": True}, "prompt": "Which tea?"}]}
PARENT = {"name": "names_parent", "steps": [
    {"id": "sub", "workflow": {"template": "names_child", "input": "input"}}]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with api_world(tmp_path_factory) as info:
        yield info


def _status(world, trace_id: str, *wanted: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = world["api"].get(f"/workflow/run/{trace_id}").json()
        if run["status"] in wanted:
            return run
        time.sleep(0.1)
    raise AssertionError(f"{trace_id}: {run['status']}")


def _row(table: str, first: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.strip("│┃| ").startswith(first))
    return [c.strip() for c in line.strip("│┃| ").replace("┃", "│").split("│")]


def test_lists_show_names_not_ids(world):
    cli, api = world["cli"], world["api"]
    template_id = world["templates"]["three_step"]["template_id"]
    ran = cli("workflow", "run", "three_step", "--input", "tea", "--watch")
    assert ran.returncode == 0, ran.stderr
    usage = cli("usage", "--by", "template")
    assert usage.returncode == 0, usage.stderr
    assert _row(usage.stdout, "three_step")[0] == "three_step" and template_id not in usage.stdout

    made = cli("key", "create", "names", "-s", "run:start", "--template", template_id)
    assert made.returncode == 0, made.stderr
    keys = cli("key", "list")
    assert keys.returncode == 0 and "three_step" in _row(keys.stdout, "names"), keys.stdout
    assert template_id not in keys.stdout

    added = cli("subscription", "add", "http://127.0.0.1:9/names", "--template", "three_step")
    assert added.returncode == 0, added.stderr
    subs = cli("subscription", "list")
    assert subs.returncode == 0 and "three_step" in _row(subs.stdout, "http://127.0.0.1:9/names"), subs.stdout
    assert template_id not in subs.stdout

    versions = cli("template", "versions", "three_step")
    assert versions.returncode == 0 and _row(versions.stdout, "1")[2] == "root", versions.stdout
    listed = api.get(f"/workflow/template/{template_id}/versions").json()["versions"]
    assert listed[-1]["author_name"] == "root"


def test_show_says_a_child_run_waits_and_what_it_asks(world):
    api = world["api"]
    for body in (CHILD, PARENT):
        assert api.post("/workflow/template", json=body).status_code == 201
    parent_id = next(t["template_id"] for t in api.get("/workflow/template").json()["templates"]
                     if t["name"] == "names_parent")
    parent = api.post("/workflow/run", json={"template_id": parent_id, "input": "x"}).json()["trace_id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        child = api.get(f"/workflow/run/{parent}").json()["steps"][0].get("child_trace_id")
        if child and api.get(f"/workflow/run/{child}").json()["pending_replies"]:
            break
        time.sleep(0.1)
    pending = api.get(f"/workflow/run/{child}").json()["pending_replies"][0]
    shown = world["cli"]("workflow", "show", parent)
    assert shown.returncode == 0, shown.stderr
    assert f"child run {child}: waiting_reply" in shown.stdout, shown.stdout
    assert "waiting for a reply at ask: Which tea?" in shown.stdout
    assert f"answer with: orchestra workflow reply {child} 'YOUR ANSWER' --request-id {pending['request_id']}" \
        in shown.stdout
    own = world["cli"]("workflow", "show", child)
    assert "waiting for a reply at ask: Which tea?" in own.stdout, own.stdout
    api.post(f"/workflow/cancel/{parent}")


def test_a_provider_error_names_the_provider(world):
    api = world["api"]
    provider = api.post("/provider", json={"name": "unreachable", "provider": "openai_compatible",
                                           "model_id": "m1", "api_key": "k", "base_url": "http://127.0.0.1:9/v1"})
    assert provider.status_code == 201, provider.text
    worker = api.post("/agent/worker", json={"name": "stuck", "provider_id": provider.json()["provider_id"]})
    assert worker.status_code == 201, worker.text
    made = api.post("/workflow/template", json={"name": "down", "steps": [
        {"id": "say", "agent": {"worker": "stuck"}, "prompt": "hi"}]})
    assert made.status_code == 201, made.text
    ran = world["cli"]("workflow", "run", "down", "--watch", timeout=120)
    assert ran.returncode == 1
    run = api.get(f"/workflow/run/{ran.stdout.split()[1]}").json()
    assert run["steps"][0]["error"].startswith("Provider 'unreachable' (model m1): Could not reach the provider")
    assert "Provider 'unreachable'" in ran.stdout
