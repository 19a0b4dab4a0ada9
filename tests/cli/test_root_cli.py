"""The root command: -V/--version, shell completion, and `--help` without `<bool>` types."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from orchestra import __version__


def orchestra(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
    return subprocess.run([sys.executable, "-m", "orchestra", *args], env={**clean, "COLUMNS": "120", **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag):
    done = orchestra(flag)
    assert done.returncode == 0 and done.stdout == f"orchestra {__version__}\n"


def test_shell_completion_is_offered_and_completes_commands():
    helped = orchestra("--help")
    assert "--install-completion" in helped.stdout and "--show-completion" in helped.stdout
    # --show-completion takes no value: it names the shell it finds among its parent
    # processes, as a user's terminal has one. A bash parent that does not exec it (the
    # test's own ancestry may have no shell: a job started with `( … &)` from one).
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
    shown = subprocess.run(["bash", "-c", '"$@"; exit $?', "bash", sys.executable, "-m", "orchestra",
                            "--show-completion"], env=clean, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "_ORCHESTRA_COMPLETE" in shown.stdout, shown.stderr
    assert "complete -o default -F _orchestra_completion orchestra" in shown.stdout  # bash's script
    completed = orchestra(_ORCHESTRA_COMPLETE="complete_bash", COMP_WORDS="orchestra temp", COMP_CWORD="1")
    assert completed.returncode == 0 and "template" in completed.stdout.split()


@pytest.mark.parametrize("args", [(), ("serve",), ("workflow", "run"), ("provider", "update"), ("file", "download"),
                                  ("user", "delete"), ("template", "create")])
def test_help_shows_no_bool_type_on_flags(args):
    done = orchestra(*args, "--help")
    assert done.returncode == 0, done.stderr
    assert "<bool>" not in done.stdout and "--help" in done.stdout


def test_store_commands_say_so_in_their_help():
    for group in ("user", "db"):
        text = " ".join(orchestra(group, "--help").stdout.split())
        assert "straight against the store" in text and "no server needed" in text


def test_every_api_area_has_a_command_group():
    text = orchestra("--help").stdout
    for name in ("account", "provider", "node", "tool", "skill", "worker", "template", "file", "workflow", "reload",
                 "login", "logout", "serve", "user", "db"):
        assert f" {name} " in text, name


@pytest.mark.parametrize("args", [("workflow", "run"), ("workflow", "reply"), ("key", "create"), ("schedule", "add"),
                                  ("workflow", "fork"), ("usage",), ("user", "create"), ("db", "prune")])
def test_help_shows_no_python_types(args):
    """Issue 39, point 10: no `<str>`, `<int range>` or `<list[str]>` in --help; a value is a
    word (TEXT, N) and an argument shows its name only."""
    done = orchestra(*args, "--help")
    assert done.returncode == 0, done.stderr
    assert not re.search(r"<(str|int|float|list)", done.stdout), done.stdout
