"""`orchestra serve` refuses bad configuration with one readable line, before any worker starts."""

import os
import subprocess
import sys


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
