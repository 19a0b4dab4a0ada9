"""schemathesis 4 against a real `orchestra serve`: every check, every phase (stateful
included, driven by the document's links), as a super administrator and as a plain user
on SQLite, and as a super administrator on PostgreSQL (skipped without
ORCHESTRA_TEST_POSTGRES_URL).

schemathesis' defaults throughout (SPEC §15): schemathesis.toml names no exception and
widens no status, so every rule the server enforces must be in the document. A failure
prints schemathesis' report (each failing case with a curl line to replay it). The seed
is fixed (SEED) so a run is repeatable; the number of examples per operation is bounded
so the whole module runs in a few minutes; `ORCHESTRA_FUZZ_EXAMPLES` and
`ORCHESTRA_FUZZ_SEED` widen or vary the search.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = os.environ.get("ORCHESTRA_FUZZ_EXAMPLES", "12")
SEED = os.environ.get("ORCHESTRA_FUZZ_SEED", "20261122")  # the recorded seed
PASSWORD = "fuzz-password-1"

pytestmark = pytest.mark.skipif(shutil.which("st") is None and not Path(sys.executable).with_name("st").exists(),
                                reason="schemathesis is not installed (pip install -e '.[test]')")


@pytest.fixture
def fuzz_server(request, tmp_path):
    """A fresh server per run (a super administrator's fuzzing may delete other users), on
    the store the test names: SQLite, or PostgreSQL when ORCHESTRA_TEST_POSTGRES_URL is set."""
    store = request.node.callspec.params["store"]
    database_url = request.getfixturevalue("postgres_url") if store == "postgres" else None
    # Streams end after 2 s (a run waiting for a reply would hold one until the request timeout).
    server = ServerProcess(tmp_path / "home", database_url=database_url,
                           env={"ORCHESTRA_SSE_MAX_SECONDS": "2"}).start()
    created = server.cli("user", "create", "root", "--role", "SUPER_ADMINISTRATOR", "--password-stdin",
                         input=PASSWORD + "\n")
    assert created.returncode == 0, created.stderr
    registered = httpx.post(f"{server.base_url}/api/v1/auth/register",
                            json={"user_name": "plain", "password": PASSWORD})
    assert registered.status_code == 201, registered.text
    yield server
    server.stop()


def _token(server: ServerProcess, user_name: str) -> str:
    response = httpx.post(f"{server.base_url}/api/v1/auth/login",
                          json={"user_name": user_name, "password": PASSWORD})
    assert response.status_code == 200, response.text
    return response.json()["access_token"]


@pytest.mark.parametrize(
    ("store", "user_name"), [("sqlite", "root"), ("sqlite", "plain"), ("postgres", "root")]
)
def test_schemathesis_finds_nothing(fuzz_server: ServerProcess, store: str, user_name: str, tmp_path: Path):
    st = shutil.which("st") or str(Path(sys.executable).with_name("st"))
    command = [
        st, "--config-file", str(CONFIG), "run", f"{fuzz_server.base_url}/api/v1/docs/openapi.json",
        "--header", f"Authorization: Bearer {_token(fuzz_server, user_name)}",
        "--checks", "all",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", EXAMPLES,
        "--seed", SEED,
        "--workers", "1",
        # Long patterns (names of up to 128 characters) make large, slow-to-build minimal examples.
        # PUT /template's body (the whole language, http and workflow steps included) makes
        # hypothesis filter most candidates: a generator limit, not a server finding.
        "--suppress-health-check", "large_base_example,too_slow,filter_too_much",
        "--request-timeout", "20",
        "--no-color",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]
    # run in tmp_path: schemathesis keeps its example database in the working directory
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    (tmp_path / "schemathesis.out").write_text(result.stdout + result.stderr)
    report = _short(result.stdout)[-20000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert "Stateful" in result.stdout and "❌" not in result.stdout, report
    log = fuzz_server.log_path.read_text(errors="replace")
    assert "unhandled error" not in log, log[-5000:]


def _short(output: str, width: int = 400) -> str:
    """schemathesis' report with its long lines (whole generated bodies) cut."""
    return "\n".join(line if len(line) <= width else line[:width] + " …" for line in output.splitlines())
