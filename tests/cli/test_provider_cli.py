"""`orchestra provider …` and `orchestra node …` straight against a store."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tests.fakes.fake_llm import FakeLLM, fake_llm  # noqa: F401 - registers the fixture

KEY = "sk-cli-secret-key-7777"


@pytest.fixture
def env(tmp_path):
    return {
        "ORCHESTRA_HOME": str(tmp_path / "home"),
        "ORCHESTRA_SECRET_KEY": "cli-secret-" + "z" * 32,
        "ORCHESTRA_DATABASE_URL": "",
    }


def test_add_list_remove(cli):
    result = cli("provider", "add", "main", "--kind", "deepseek", "--model-id", "deepseek-chat", "--api-key-stdin", input=KEY + "\n")
    assert result.exit_code == 0, result.output
    assert KEY not in result.output and "sk-…7777" in result.output
    listed = cli("provider", "list", "--json")
    assert listed.exit_code == 0
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["provider"], r["model_id"], r["api_key"]) for r in rows] == [
        ("main", "deepseek", "deepseek-chat", "sk-…7777")
    ]
    table = cli("provider", "list")
    assert "main" in table.stdout and KEY not in table.stdout
    removed = cli("provider", "remove", "main", "--yes")
    assert removed.exit_code == 0, removed.output
    assert json.loads(cli("provider", "list", "--json").stdout) == []


def test_store_holds_no_plain_key(cli, env):
    cli("provider", "add", "main", "-k", "openai", "-m", "gpt-4o", "--api-key-stdin", input=KEY + "\n")
    db = os.path.join(env["ORCHESTRA_HOME"], "orchestra.db")
    for name in os.listdir(env["ORCHESTRA_HOME"]):  # the db and its WAL
        if name.startswith("orchestra.db"):
            with open(os.path.join(env["ORCHESTRA_HOME"], name), "rb") as handle:
                assert KEY.encode() not in handle.read()
    assert os.path.exists(db)


def test_errors_are_one_line_with_exit_codes(cli):
    result = cli("provider", "add", "g", "--kind", "gemini", "-m", "x", "--no-api-key")
    assert result.exit_code == 2
    assert "supported kinds: openai, deepseek, anthropic, ollama, openai_compatible" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = cli("provider", "add", "k", "--kind", "openai", "-m", "x")  # no tty for the prompt
    assert result.exit_code == 2 and "--api-key-stdin" in result.stderr
    result = cli("provider", "add", "c", "--kind", "openai_compatible", "-m", "x", "--no-api-key")
    assert result.exit_code == 2 and "base_url" in result.stderr
    cli("provider", "add", "dup", "-k", "ollama", "-m", "llama3")
    result = cli("provider", "add", "dup", "-k", "ollama", "-m", "llama3")
    assert result.exit_code == 4 and "already exists" in result.stderr
    result = cli("provider", "remove", "ghost", "--yes")
    assert result.exit_code == 3 and "ghost" in result.stderr
    result = cli("provider", "remove", "dup")  # no terminal to confirm
    assert result.exit_code == 2


def test_check_against_fake_llm(cli, fake_llm):  # noqa: F811
    cli("provider", "add", "fake", "-k", "openai_compatible", "-m", "fake-model",
        "--base-url", fake_llm.base_url, "--api-key-stdin", input="good-key\n")
    result = cli("provider", "check", "fake", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"ok": True, "models": sorted(fake_llm.models)}
    result = cli("provider", "check", "fake")
    assert result.exit_code == 0 and "fake-model-large" in result.stdout
    cli("provider", "add", "badfake", "-k", "openai_compatible", "-m", "fake-model",
        "--base-url", fake_llm.base_url, "--api-key-stdin", input="bad-key\n")
    result = cli("provider", "check", "badfake")
    assert result.exit_code == 6 and "Incorrect API key provided" in result.stderr


def test_node_list_and_set(cli):
    cli("provider", "add", "main", "-k", "ollama", "-m", "llama3")
    nodes = json.loads(cli("node", "list", "--json").stdout)
    assert [n["name"] for n in nodes] == ["planner", "reviewer", "summarizer"]
    assert all(n["provider"] is None for n in nodes)
    result = cli("node", "set", "reviewer", "--provider", "main", "--model", "llama3:70b")
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n for n in json.loads(cli("node", "list", "--json").stdout)}
    assert nodes["reviewer"]["provider_name"] == "main" and nodes["reviewer"]["model"] == "llama3:70b"
    assert nodes["reviewer"]["tools"] == ["calculator"]
    result = cli("node", "set", "reviewer", "--default-model")
    assert result.exit_code == 0
    assert {n["name"]: n for n in json.loads(cli("node", "list", "--json").stdout)}["reviewer"]["model"] is None
    assert "reviewer" in cli("node", "list").stdout
    assert cli("node", "set", "janitor", "--model", "x").exit_code == 3
    assert cli("node", "set", "planner", "--provider", "ghost").exit_code == 3
    assert cli("node", "set", "planner").exit_code == 2
    result = cli("provider", "remove", "main", "--yes")
    assert result.exit_code == 4 and "reviewer" in result.stderr


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


def test_hidden_prompt_never_echoes_the_key(env):
    """On a real terminal the key is asked for with echo off."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestra", "provider", "add", "tty", "-k", "openai", "-m", "gpt-4o"],
        stdin=slave, stdout=slave, stderr=slave, env={**os.environ, **env}, close_fds=True,
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
