"""`orchestra login` / `logout` and the kept credentials, against a real server process."""

from __future__ import annotations

import stat

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import PASSWORD, ClientCLI, make_user
from tests.conftest import free_port


def test_login_keeps_a_0600_file_and_logout_removes_it(server, tmp_path):
    make_user(server, "alice", "USER")
    cli = ClientCLI(tmp_path / "client")
    done = cli("login", "--server", server.base_url + "/", "--user", "alice", "--password-stdin",
               input=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    assert "logged in" in done.stderr and PASSWORD not in done.stderr + done.stdout
    assert stat.S_IMODE(cli.credentials.stat().st_mode) == 0o600
    kept = cli.kept()
    assert kept["server"] == server.base_url
    assert kept["user_name"] == "alice"
    assert kept["access_token"].count(".") == 2 and kept["refresh_token"].count(".") == 2
    assert PASSWORD not in cli.credentials.read_text()

    done = cli("logout")
    assert done.returncode == 0 and not cli.credentials.exists()
    done = cli("logout")
    assert done.returncode == 0 and "not logged in" in done.stderr


def test_login_with_a_wrong_password_keeps_nothing(server, tmp_path):
    make_user(server, "alice", "USER")
    cli = ClientCLI(tmp_path / "client")
    done = cli("login", "--server", server.base_url, "--user", "alice", "--password-stdin",
               input="wrong-password\n")
    assert done.returncode == ExitCode.AUTH
    assert done.stderr.strip().splitlines() == ["error: The password is wrong."]
    assert not cli.credentials.exists()

    done = cli("login", "--server", server.base_url, "--user", "nobody", "--password-stdin",
               input=PASSWORD + "\n")
    assert done.returncode == ExitCode.NOT_FOUND
    assert len(done.stderr.strip().splitlines()) == 1


def test_login_needs_a_server_and_a_user_without_a_terminal(tmp_path):
    cli = ClientCLI(tmp_path / "client")
    done = cli("login", "--user", "alice", "--password-stdin", input=PASSWORD + "\n")
    assert done.returncode == ExitCode.USAGE and "--server" in done.stderr
    done = cli("login", "--server", "http://127.0.0.1:1", input="")
    assert done.returncode == ExitCode.USAGE and "--user" in done.stderr


def test_server_down_gives_one_readable_line(tmp_path):
    cli = ClientCLI(tmp_path / "client")
    url = f"http://127.0.0.1:{free_port()}"
    done = cli("login", "--server", url, "--user", "alice", "--password-stdin", input=PASSWORD + "\n")
    assert done.returncode == ExitCode.UNAVAILABLE
    assert done.stderr.strip().splitlines() == [f"error: cannot reach the server at {url}: connection refused"]
    for args in (["workflow", "list"], ["workflow", "watch", "some-trace"], ["workflow", "reply", "t", "hi"]):
        done = cli(*args, "--server", url, "--token", "x")
        assert done.returncode == ExitCode.UNAVAILABLE, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_server_commands_without_server_or_login_say_what_to_do(tmp_path):
    cli = ClientCLI(tmp_path / "client")
    done = cli("workflow", "list")
    assert done.returncode == ExitCode.USAGE
    assert "orchestra login" in done.stderr and len(done.stderr.strip().splitlines()) == 1
