"""Helpers for CLI tests against a real server: run `python -m orchestra` as a client
with its own home, and set up a provider (a FakeLLM), a worker and templates."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests import warm_cli
from tests.conftest import ServerProcess

PASSWORD = "password-123"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "templates"


class ClientCLI:
    """`orchestra …` as a user's terminal would run it: its own $ORCHESTRA_HOME, no server env."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
        self.env["ORCHESTRA_HOME"] = str(home)
        self.env["COLUMNS"] = "200"

    def __call__(self, *args: str, input: str | None = None, env: dict | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess:
        return warm_cli.run(list(args), env={**self.env, **(env or {})}, input=input, timeout=timeout)

    @property
    def credentials(self) -> Path:
        return self.home / "credentials.json"

    def kept(self) -> dict:
        return json.loads(self.credentials.read_text())


def make_user(server: ServerProcess, name: str, role: str = "SUPER_ADMINISTRATOR") -> None:
    done = server.cli("user", "create", name, "--role", role, "--password-stdin", input=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr


def api_token(server: ServerProcess, name: str) -> str:
    response = httpx.post(f"{server.base_url}/api/v1/auth/login",
                          json={"user_name": name, "password": PASSWORD})
    assert response.status_code == 200, response.text
    return response.json()["access_token"]


def setup_world(server: ServerProcess, llm_url: str, name: str = "root") -> dict:
    """A super administrator, a provider on `llm_url`, a worker, and both example templates."""
    make_user(server, name)
    token = api_token(server, name)

    def fresh_token(request: httpx.Request) -> None:  # servers with a 1 s token lifetime
        request.headers["Authorization"] = f"Bearer {api_token(server, name)}"

    with httpx.Client(base_url=f"{server.base_url}/api/v1", event_hooks={"request": [fresh_token]}) as http:
        provider = http.post("/provider", json={
            "name": "fake", "provider": "openai_compatible", "model_id": "fake-model",
            "api_key": "any-key", "base_url": llm_url})
        assert provider.status_code == 201, provider.text
        worker = http.post("/agent/worker", json={
            "name": "helper", "provider_id": provider.json()["provider_id"], "tools": ["calculator"]})
        assert worker.status_code == 201, worker.text
        worker_id = worker.json()["worker_id"]
        templates = {}
        for stem in ("three_step", "with_human"):
            body = (EXAMPLES / f"{stem}.json").read_text()
            created = http.post("/workflow/template", json=json.loads(body))
            assert created.status_code == 201, created.text
            templates[stem] = created.json()
    return {"token": token, "provider_id": provider.json()["provider_id"],
            "worker_id": worker_id, "templates": templates}


def one_error_line(done) -> str:
    """The single `error: …` line a failed command printed on stderr (asserted to be one)."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@contextmanager
def api_world(tmp_path_factory) -> Iterator[dict]:
    """`logged_in_world` on its own FakeLLM, plus `api` (an httpx client with root's token
    on /api/v1, to check what the server holds) and `llm`."""
    from tests.fakes.fake_llm import FakeLLM

    with (
        FakeLLM() as llm,
        logged_in_world(tmp_path_factory, llm.base_url) as info,
        httpx.Client(base_url=f"{info['server'].base_url}/api/v1",
                     headers={"Authorization": f"Bearer {info['token']}"}) as api,
    ):
        info.update(api=api, llm=llm)
        yield info


@contextmanager
def logged_in_world(tmp_path_factory, llm_url: str) -> Iterator[dict]:
    """A started server with `setup_world`, and a client CLI logged in as root; the
    server stops afterwards. Yields setup_world's dict plus `cli` and `server`."""
    server = ServerProcess(tmp_path_factory.mktemp("srv")).start()
    try:
        info = setup_world(server, llm_url)
        cli = ClientCLI(tmp_path_factory.mktemp("client"))
        done = cli("login", "--server", server.base_url, "--user", "root", "--password-stdin",
                   input=PASSWORD + "\n")
        assert done.returncode == 0, done.stderr
        info.update(cli=cli, server=server)
        yield info
    finally:
        server.stop()
