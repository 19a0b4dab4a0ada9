"""The fast loop and the strict CI (tests/conftest.py): a test that starts a server must
be marked e2e, and with ORCHESTRA_TEST_REQUIRE_ALL=1 any skipped test fails the session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
PARALLEL = Path(__file__).with_name("parallel.py")  # conftest.py's free_port is there
WARM_CLI = Path(__file__).with_name("warm_cli.py")  # conftest.py's ServerProcess starts through it


def run_pytest(folder: Path, body: str, *options: str, **env: str) -> subprocess.CompletedProcess:
    (folder / "tests").mkdir()
    (folder / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    (folder / "tests" / "parallel.py").write_text(PARALLEL.read_text())
    (folder / "tests" / "warm_cli.py").write_text(WARM_CLI.read_text())
    (folder / "tests" / "test_it.py").write_text(body)
    (folder / "pytest.ini").write_text("[pytest]\npythonpath = .\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    e2e: real servers\n")
    environ = {k: v for k, v in os.environ.items() if k != "ORCHESTRA_TEST_REQUIRE_ALL"}
    # Only the plugin conftest.py needs: loading every installed one (schemathesis and
    # hypothesis) costs more than the run itself.
    environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin", *options, "tests"],
        cwd=folder, env={**environ, **env}, capture_output=True, text=True, timeout=120,
    )


SKIPPING = "import pytest\n\ndef test_skips():\n    pytest.skip('no chromium here')\n\ndef test_runs():\n    pass\n"


def test_a_skip_is_a_failure_when_every_family_is_required(tmp_path):
    done = run_pytest(tmp_path, SKIPPING, ORCHESTRA_TEST_REQUIRE_ALL="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "test_it.py::test_skips: Skipped: no chromium here" in done.stderr


MODULE_SKIPPED = ("import pytest\n\npytest.importorskip('no_such_module_here', reason='no browser driver')\n\n"
                  "def test_never_collected():\n    pass\n")


def test_a_module_skipped_at_collection_is_a_failure_when_every_family_is_required(tmp_path):
    """An `importorskip` at module level skips the module before any test is reported:
    the guard counts collection reports too."""
    done = run_pytest(tmp_path, MODULE_SKIPPED, ORCHESTRA_TEST_REQUIRE_ALL="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tests/test_it.py: Skipped: no browser driver (the whole module)" in done.stderr


def test_a_skip_is_only_reported_otherwise(tmp_path):
    done = run_pytest(tmp_path, SKIPPING)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in done.stdout


@pytest.mark.parametrize(("mark", "expected"), [
    ("", "starts a server: mark it @pytest.mark.e2e"),
    ("@pytest.mark.e2e\n", "server exited early"),  # allowed to start; its bad setting stops it
])
def test_starting_a_server_needs_the_e2e_mark(tmp_path, mark, expected):
    body = (
        "import pytest\nfrom tests.conftest import ServerProcess\n\n"
        f"{mark}def test_starts(tmp_path):\n"
        "    server = ServerProcess(tmp_path / 'home', env={'ORCHESTRA_RATE_LIMIT_LOGIN': 'lots'})\n"
        "    with pytest.raises(RuntimeError) as caught:\n"
        "        server.start(timeout=60)\n"
        f"    assert {expected!r} in str(caught.value)\n"
    )
    done = run_pytest(tmp_path, body)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_many_skips_for_one_reason_are_one_line_under_q(tmp_path):
    """The fast loop on a clone without PostgreSQL skips hundreds of tests: with the
    project's report options, `-q` shows one line a reason with its count, not a line each."""
    import tomllib

    addopts = tomllib.loads((CONFTEST.parents[1] / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    report = [opt for opt in addopts["addopts"].split() if opt.startswith("-r")]
    body = "import pytest\n\n" + "".join(
        f"def test_{n}():\n    pytest.skip('no PostgreSQL here')\n\n" for n in range(40))
    body += "def test_other():\n    pytest.skip('no chromium here')\n\ndef test_runs():\n    pass\n"
    done = run_pytest(tmp_path, body, *report)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if "SKIPPED" in line] == [], done.stdout
    assert [line.strip() for line in lines if "×" in line] == ["40 × Skipped: no PostgreSQL here", "1 × Skipped: no chromium here"]
    assert "1 passed, 41 skipped" in done.stdout
