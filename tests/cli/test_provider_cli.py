"""`orchestra provider …` and `orchestra node …` through a real server (never the store)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import PASSWORD, ClientCLI, api_world, make_user, one_error_line

KEY = "sk-cli-secret-key-7777"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A server (with the harness's provider `fake` on a FakeLLM); a CLI logged in as root."""
    with api_world(tmp_path_factory) as info:
        yield info


def stored_providers(world) -> dict[str, dict]:
    return {p["name"]: p for p in world["api"].get("/provider").json()["providers"]}


def test_add_goes_through_the_server_list_show_and_remove(world):
    cli = world["cli"]
    done = cli("provider", "add", "main", "--kind", "deepseek", "--model-id", "deepseek-chat",
               "--api-key-stdin", input=KEY + "\n")
    assert done.returncode == 0, done.stderr
    provider_id = done.stdout.strip()
    assert done.stdout == provider_id + "\n" and len(provider_id) == 36
    assert KEY not in done.stderr + done.stdout and "sk-…7777" in done.stderr
    stored = stored_providers(world)["main"]  # the server has it, as the CLI said
    assert (stored["provider_id"], stored["provider"], stored["model_id"], stored["api_key"]) == (
        provider_id, "deepseek", "deepseek-chat", "sk-…7777")
    # the client's home holds no store: nothing was written next to the CLI
    assert not (world["cli"].home / "orchestra.db").exists()

    listed = json.loads(cli("provider", "list", "--json").stdout)
    assert [p["name"] for p in listed] == [p["name"] for p in world["api"].get("/provider").json()["providers"]]
    assert all("message" not in p for p in listed)
    table = cli("provider", "list")
    assert "main" in table.stdout and provider_id in table.stdout and KEY not in table.stdout

    by_name = json.loads(cli("provider", "show", "main", "--json").stdout)
    assert by_name == {k: v for k, v in world["api"].get(f"/provider/{provider_id}").json().items()
                       if k != "message"}
    plain = cli("provider", "show", provider_id)
    assert plain.returncode == 0 and "model_id: deepseek-chat" in plain.stdout

    refused = cli("provider", "remove", "main")  # no terminal to confirm
    assert refused.returncode == ExitCode.USAGE and "--yes" in one_error_line(refused)
    removed = cli("provider", "remove", "main", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert "main" not in stored_providers(world)
    gone = cli("provider", "show", "main")
    assert gone.returncode == ExitCode.NOT_FOUND and "unknown provider 'main'" in one_error_line(gone)


def test_update_changes_only_what_is_given(world):
    cli = world["cli"]
    provider_id = cli("provider", "add", "changing", "-k", "openai", "-m", "gpt-4o", "--api-key-stdin",
                      input="sk-first-key-1111\n").stdout.strip()
    # a new base_url without the key sent again: the stored key would go elsewhere (SPEC §15)
    done = cli("provider", "update", "changing", "--base-url", "https://example.test/v1")
    assert done.returncode == ExitCode.USAGE and "api_key" in one_error_line(done)
    done = cli("provider", "update", "changing", "--model-id", "gpt-4.1", "--base-url",
               "https://example.test/v1", "--json", "--api-key-stdin", input="sk-first-key-1111\n")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert (body["name"], body["model_id"], body["base_url"], body["api_key"]) == (
        "changing", "gpt-4.1", "https://example.test/v1", "sk-…1111")
    assert world["api"].get(f"/provider/{provider_id}").json()["model_id"] == "gpt-4.1"

    done = cli("provider", "update", provider_id, "--name", "renamed", "--api-key-stdin",
               input="sk-second-key-2222\n")
    assert done.returncode == 0, done.stderr
    stored = world["api"].get(f"/provider/{provider_id}").json()
    assert (stored["name"], stored["api_key"], stored["model_id"]) == ("renamed", "sk-…2222", "gpt-4.1")

    done = cli("provider", "update", "renamed", "--no-api-key", "--no-base-url")
    assert done.returncode == 0, done.stderr
    stored = world["api"].get(f"/provider/{provider_id}").json()
    assert stored["api_key"] is None and stored["has_api_key"] is False and stored["base_url"] is None

    nothing = cli("provider", "update", "renamed")
    assert nothing.returncode == ExitCode.USAGE and "nothing to change" in one_error_line(nothing)
    both = cli("provider", "update", "renamed", "--base-url", "http://x.test", "--no-base-url")
    assert both.returncode == ExitCode.USAGE
    bad = cli("provider", "update", "renamed", "--base-url", "not a url")
    assert bad.returncode == ExitCode.USAGE and "base_url" in one_error_line(bad)
    cli("provider", "remove", "renamed", "--yes")


def test_errors_are_one_line_with_exit_codes(world):
    cli = world["cli"]
    done = cli("provider", "add", "g", "--kind", "gemini", "-m", "x", "--no-api-key")
    assert done.returncode == ExitCode.USAGE
    assert "supported kinds: openai, deepseek, anthropic, ollama, openai_compatible" in one_error_line(done)
    done = cli("provider", "add", "k", "--kind", "openai", "-m", "x")  # no tty for the prompt
    assert done.returncode == ExitCode.USAGE and "--api-key-stdin" in done.stderr
    done = cli("provider", "add", "c", "--kind", "openai_compatible", "-m", "x", "--no-api-key")
    assert done.returncode == ExitCode.USAGE and "base_url" in one_error_line(done)
    assert cli("provider", "add", "dup", "-k", "ollama", "-m", "llama3").returncode == 0
    done = cli("provider", "add", "DUP", "-k", "ollama", "-m", "llama3")
    assert done.returncode == ExitCode.CONFLICT and "already exists" in one_error_line(done)
    done = cli("provider", "remove", "ghost", "--yes")
    assert done.returncode == ExitCode.NOT_FOUND and "ghost" in one_error_line(done)
    cli("provider", "remove", "dup", "--yes")


def test_a_plain_user_may_read_but_not_manage(world, tmp_path):
    make_user(world["server"], "plain", "USER")
    user = ClientCLI(tmp_path / "plain")
    assert user("login", "--server", world["server"].base_url, "--user", "plain", "--password-stdin",
                input=PASSWORD + "\n").returncode == 0
    assert "fake" in [p["name"] for p in json.loads(user("provider", "list", "--json").stdout)]
    done = user("provider", "add", "mine", "-k", "ollama", "-m", "llama3")
    assert done.returncode == ExitCode.AUTH and one_error_line(done)
    assert "mine" not in stored_providers(world)
    done = user("node", "set", "planner", "--provider", "fake")
    assert done.returncode == ExitCode.AUTH


def test_check_against_fake_llm(world):
    cli = world["cli"]
    done = cli("provider", "check", "fake", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "models": sorted(world["llm"].models)}
    done = cli("provider", "check", "fake")
    assert done.returncode == 0 and "fake-model-large" in done.stdout
    cli("provider", "add", "badfake", "-k", "openai_compatible", "-m", "fake-model",
        "--base-url", world["llm"].base_url, "--api-key-stdin", input="bad-key\n")
    done = cli("provider", "check", "badfake")
    assert done.returncode == ExitCode.UNAVAILABLE and "refused the API key" in one_error_line(done)
    assert "Incorrect API key provided" not in done.stderr  # the provider's body is not echoed
    cli("provider", "remove", "badfake", "--yes")


def test_node_list_show_and_set(world):
    cli = world["cli"]
    cli("provider", "add", "local", "-k", "ollama", "-m", "llama3")
    nodes = json.loads(cli("node", "list", "--json").stdout)
    assert [n["name"] for n in nodes] == ["planner", "reviewer", "summarizer"]
    done = cli("node", "set", "reviewer", "--provider", "local", "--model", "llama3:70b")
    assert done.returncode == 0, done.stderr
    assert "reviewer: provider local, model llama3:70b" in done.stderr
    stored = world["api"].get("/agent/node/reviewer").json()
    assert stored["provider_name"] == "local" and stored["model"] == "llama3:70b"
    assert stored["tools"] == ["calculator"]
    shown = json.loads(cli("node", "show", "reviewer", "--json").stdout)
    assert shown == {k: v for k, v in stored.items() if k != "message"}
    assert cli("node", "set", "reviewer", "--default-model").returncode == 0
    assert world["api"].get("/agent/node/reviewer").json()["model"] is None
    assert "reviewer" in cli("node", "list").stdout
    assert cli("node", "set", "janitor", "--model", "x").returncode == ExitCode.NOT_FOUND
    assert cli("node", "set", "planner", "--provider", "ghost").returncode == ExitCode.NOT_FOUND
    assert cli("node", "set", "planner").returncode == ExitCode.USAGE
    done = cli("provider", "remove", "local", "--yes")
    assert done.returncode == ExitCode.CONFLICT and "reviewer" in one_error_line(done)
    assert cli("node", "set", "reviewer", "--no-provider").returncode == 0
    assert world["api"].get("/agent/node/reviewer").json()["provider"] is None
    assert cli("provider", "remove", "local", "--yes").returncode == 0


def _read_until(fd: int, needle: bytes, timeout: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_hidden_prompt_never_echoes_the_key(world):
    """On a real terminal the key is asked for with echo off, and sent to the server."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestra", "provider", "add", "tty", "-k", "openai", "-m", "gpt-4o"],
        stdin=slave, stdout=slave, stderr=slave, env=world["cli"].env, close_fds=True,
    )
    os.close(slave)
    try:
        # click prints the prompt, then getpass flushes pending input, turns echo off and
        # writes the final " ": only after that space is typing safe.
        seen = _read_until(master, b"(empty for none): ")
        assert b"(empty for none): " in seen, seen
        os.write(master, KEY.encode() + b"\n")
        seen += _read_until(master, b"registered")
        proc.wait(timeout=30)
        seen += _read_until(master, b"\x00", timeout=0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 0, seen
    assert KEY.encode() not in seen and "sk-…7777".encode() in seen
    assert stored_providers(world)["tty"]["api_key"] == "sk-…7777"
    world["cli"]("provider", "remove", "tty", "--yes")


def test_provider_commands_take_a_workspace(world):
    """SPEC §16: `--workspace` names the workspace whose own providers a command acts on
    (without it: the instance-wide ones); `worker create --provider NAME` in a workspace
    finds that workspace's provider by name."""
    cli, api = world["cli"], world["api"]
    made = api.post("/workspace", json={"name": "providerteam"})
    assert made.status_code == 201, made.text
    wid = made.json()["workspace_id"]
    done = cli("provider", "add", "teammodel", "-k", "deepseek", "-m", "deepseek-chat", "--api-key-stdin",
               "--workspace", "providerteam", input=KEY + "\n")
    assert done.returncode == 0, done.stderr
    provider_id = done.stdout.strip()
    [stored] = api.get("/provider", params={"workspace_id": wid}).json()["providers"]
    assert (stored["provider_id"], stored["name"], stored["workspace_id"]) == (provider_id, "teammodel", wid)
    assert "teammodel" not in stored_providers(world)  # not an instance-wide one
    listed = cli("provider", "list", "--workspace", wid, "--json")
    assert listed.returncode == 0 and [p["provider_id"] for p in json.loads(listed.stdout)] == [provider_id]
    assert provider_id not in cli("provider", "list", "--json").stdout
    shown = cli("provider", "show", "teammodel", "--workspace", "providerteam", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["workspace_id"] == wid, shown.stderr
    assert cli("provider", "show", "teammodel").returncode == ExitCode.NOT_FOUND
    changed = cli("provider", "update", "teammodel", "--model-id", "deepseek-reasoner", "--workspace", "providerteam")
    assert changed.returncode == 0, changed.stderr
    assert api.get(f"/provider/{provider_id}", params={"workspace_id": wid}).json()["model_id"] == "deepseek-reasoner"
    worker = cli("worker", "create", "teamhand", "--provider", "teammodel", "--workspace", "providerteam")
    assert worker.returncode == 0, worker.stderr
    assert api.get(f"/agent/worker/{worker.stdout.strip()}").json()["provider_id"] == provider_id
    elsewhere = cli("worker", "create", "minehand", "--provider", "teammodel")  # another workspace's: unknown
    assert elsewhere.returncode != 0 and "unknown provider 'teammodel'" in one_error_line(elsewhere)
    assert api.delete(f"/agent/worker/{worker.stdout.strip()}").status_code == 200
    assert cli("provider", "remove", "teammodel", "--yes").returncode == ExitCode.NOT_FOUND
    gone = cli("provider", "remove", "teammodel", "--yes", "--workspace", "providerteam")
    assert gone.returncode == 0, gone.stderr
    assert api.get("/provider", params={"workspace_id": wid}).json()["providers"] == []
