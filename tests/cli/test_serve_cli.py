"""`orchestra serve` refuses bad configuration with one readable line, before any worker starts."""

import os
import select
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import free_port


def serve(tmp_path, *args, **env):
    return subprocess.run(
        [sys.executable, "-m", "orchestra", *args],
        env={**os.environ, "ORCHESTRA_HOME": str(tmp_path / "home"), **env},
        capture_output=True, text=True, timeout=60,
    )


def assert_one_error_line(done, text):
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error:"), done.stderr
    assert text in lines[0]
    assert "Traceback" not in done.stderr


def test_root_db_option_reaches_serve(tmp_path):
    done = serve(tmp_path, "--db", "mysql://somewhere/db", "serve", "--port", "1")
    assert_one_error_line(done, "unsupported database URL 'mysql://somewhere/db'")


def test_bad_rate_limit_is_one_line(tmp_path):
    done = serve(tmp_path, "serve", "--port", "1", ORCHESTRA_RATE_LIMIT_LOGIN="lots")
    assert_one_error_line(done, "lots")


def test_bad_limiter_storage_is_one_line(tmp_path):
    done = serve(tmp_path, "serve", "--port", "1", ORCHESTRA_LIMITER_STORAGE="carrier-pigeon://")
    assert_one_error_line(done, "carrier-pigeon://")


def test_unreachable_postgres_is_one_line(tmp_path):
    done = serve(tmp_path, "--db", "postgresql://postgres@127.0.0.1:1/none", "user", "list")
    assert_one_error_line(done, "127.0.0.1")


def test_unreachable_postgres_names_the_address_not_an_errno(tmp_path):
    done = serve(tmp_path, "--db", "postgresql://postgres@127.0.0.1:1/none", "serve", "--port", "1")
    assert_one_error_line(done, "cannot connect to PostgreSQL at 127.0.0.1:1: connection refused")
    assert "Errno" not in done.stderr and "ORCHESTRA_DATABASE_URL" in done.stderr


def test_missing_asyncpg_names_the_postgres_extra(tmp_path):
    hidden = tmp_path / "hide" / "asyncpg"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named asyncpg (hidden by a test)')\n")
    done = serve(tmp_path, "--db", "postgresql://postgres@127.0.0.1:5432/test", "serve",
                 "--port", str(free_port()), PYTHONPATH=str(hidden.parent))  # 8000 may be taken
    assert_one_error_line(done, "pip install 'orchestra[postgres]' (the postgres extra)")


def test_port_out_of_range_is_one_line(tmp_path):
    done = serve(tmp_path, "serve", "--port", "99999")
    assert_one_error_line(done, "port 99999 is out of range: use 1-65535 (--port or ORCHESTRA_PORT)")
    assert done.returncode == 2
    done = serve(tmp_path, "serve", ORCHESTRA_PORT="70000")
    assert_one_error_line(done, "port 70000 is out of range")


def test_bad_host_is_one_line(tmp_path):
    done = serve(tmp_path, "serve", "--host", "no-such-host.invalid", "--port", "8000")
    assert_one_error_line(done, "cannot listen on host 'no-such-host.invalid'")
    assert "--host or ORCHESTRA_HOST" in done.stderr and "listening" not in done.stderr


def test_port_in_use_is_one_line_and_never_claims_to_listen(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve(tmp_path, "serve", "--port", str(port))
    assert_one_error_line(done, f"cannot listen on 127.0.0.1:{port}: the address is already in use")
    assert "listening" not in done.stderr


def test_a_home_that_cannot_be_used_names_orchestra_home(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    done = subprocess.run([sys.executable, "-m", "orchestra", "serve", "--port", "1"],
                          env={**os.environ, "ORCHESTRA_HOME": str(not_a_folder / "home")},
                          capture_output=True, text=True, timeout=60)
    assert_one_error_line(done, f"cannot use the home folder {not_a_folder / 'home'}")
    assert "ORCHESTRA_HOME" in done.stderr


@pytest.mark.e2e
def test_listening_is_announced_only_once_the_port_is_bound(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "orchestra", "serve", "--port", str(port)],
                                env={**os.environ, "ORCHESTRA_HOME": str(tmp_path / "home")},
                                stderr=handle, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=1):  # bound when announced
            pass
        banner = log.read_text()
        assert f"orchestra listening on http://127.0.0.1:{port} (store: sqlite:" in banner
        assert f"  web console  http://127.0.0.1:{port}/\n" in banner  # the console is named
        assert f"  API          http://127.0.0.1:{port}/api/v1 " in banner
    finally:
        proc.terminate()  # as ServerProcess.stop: a SIGTERM in the first instants is not always honoured
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.e2e
def test_on_a_terminal_the_banner_names_the_console_and_no_sanic_flags(tmp_path):
    """On a terminal Sanic would add "consider using '--debug' or '--dev'": flags that
    `orchestra serve` does not have. The banner names the console and the API instead."""
    import pty

    port = free_port()
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "orchestra", "serve", "--port", str(port)],
                            env={**os.environ, "ORCHESTRA_HOME": str(tmp_path / "home")},
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"Worker ready" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                seen += os.read(master, 65536)
        text = seen.decode("utf-8", "replace")
        assert "Worker ready" in text, text
        assert f"web console  http://127.0.0.1:{port}/" in text
        assert "--debug" not in text and "--dev" not in text and "PRODUCTION" not in text, text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(master)
