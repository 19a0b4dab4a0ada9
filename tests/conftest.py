"""Shared fixtures: settings on a temp home, stores (SQLite file, PostgreSQL database),
the in-process app client, and a real `orchestra serve` process for end-to-end tests.

PostgreSQL tests use ORCHESTRA_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test):
each test creates and drops its own database. Without the variable they skip and say
why; with it set, an unreachable server FAILS them, so CI cannot go green by losing
every PostgreSQL variant (likewise ORCHESTRA_TEST_REDIS_URL for the Redis tests).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx
import pytest
from sanic import Sanic

from orchestra.core import Core
from orchestra.settings import Settings
from orchestra.web.app import create_app

# Cheap argon2 parameters: the tests exercise the real hasher, not its cost.
FAST_HASH = {"argon2_time_cost": 1, "argon2_memory_cost": 1024, "argon2_parallelism": 1}
# Generous limits by default; rate-limit tests set their own.
OPEN_LIMITS = {"rate_limit_register": "10000/minute", "rate_limit_login": "10000/minute"}

Sanic.test_mode = True

# --- markers: a fast loop and a strict CI ------------------------------------------------
#
# `e2e` marks tests that start real server processes, browsers or several PostgreSQL
# clients: `pytest -m "not e2e"` is the fast loop, plain `pytest` (CI) runs everything.
# Every test under tests/e2e/, the console's browser tests and any test using the
# `server` fixture is marked here; others that start a server carry the mark themselves,
# and ServerProcess.start() refuses to run in a test without it, so the mark cannot rot.
E2E_PATHS = ("tests/e2e/", "tests/console/test_console_browser.py")
E2E_FIXTURES = {"server", "chromium", "world", "upload_server"}


def pytest_collection_modifyitems(config, items) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        path = Path(str(item.path)).relative_to(root).as_posix() if str(item.path).startswith(str(root)) else ""
        if path.startswith(E2E_PATHS) or E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    # In the environment, not a global: tests import this file as `tests.conftest`, a
    # second copy of the module pytest loaded as `conftest`.
    os.environ["ORCHESTRA_TEST_CURRENT"] = ("e2e " if item.get_closest_marker("e2e") else "") + item.nodeid


# ORCHESTRA_TEST_REQUIRE_ALL=1 (set by .ci/run): a skipped test fails the session, so CI
# cannot go green while a promised family (PostgreSQL, Redis, Chromium, schemathesis)
# quietly did not run.
_skipped: list[str] = []


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus) -> None:
    if os.environ.get("ORCHESTRA_TEST_REQUIRE_ALL") == "1" and _skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\nORCHESTRA_TEST_REQUIRE_ALL=1 and these tests were skipped:", file=sys.stderr)
        for line in _skipped[:50]:
            print(f"  {line}", file=sys.stderr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- stores ---------------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'orchestra.db'}"


def _postgres_base_url() -> str | None:
    return os.environ.get("ORCHESTRA_TEST_POSTGRES_URL") or None


async def _pg_admin(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=5)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def postgres_url():
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    base = _postgres_base_url()
    if base is None:
        pytest.skip("PostgreSQL tests need ORCHESTRA_TEST_POSTGRES_URL (see .ci/run)")
    name = f"orchestra_test_{uuid.uuid4().hex[:12]}"
    try:
        asyncio.run(_pg_admin(base, f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001 - configured but unusable: a failure, not a skip
        pytest.fail(
            f"ORCHESTRA_TEST_POSTGRES_URL is set but PostgreSQL at {base} cannot be used: {exc!r}",
            pytrace=False,
        )
    parsed = urlparse(base)
    yield urlunparse(parsed._replace(path=f"/{name}"))
    asyncio.run(_pg_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """The store of a test; modules that run on both stores override this fixture."""
    return sqlite_url


@pytest.fixture(params=["sqlite", "postgres"])
def both_stores(request) -> str:
    """Parametrise a test (or, by overriding `database_url`, a module) over both stores."""
    return request.getfixturevalue(f"{request.param}_url")


# --- settings, core, app --------------------------------------------------------------


@pytest.fixture
def settings_overrides() -> dict:
    """Override in a module or test to change settings for its app/core."""
    return {}


@pytest.fixture
def settings(tmp_path: Path, database_url: str, settings_overrides: dict) -> Settings:
    return make_settings(tmp_path / "home", database_url, **settings_overrides)


def make_settings(home: Path, database_url: str, **overrides) -> Settings:
    values = {**FAST_HASH, **OPEN_LIMITS, "secret_key": "test-secret-" + "x" * 32, **overrides}
    return Settings.from_env(env={}, home=home, database_url=database_url, **values)


@pytest.fixture
async def core(settings: Settings):
    core = await Core.open(settings)
    yield core
    await core.close()


@asynccontextmanager
async def running_app(settings: Settings):
    """The app with its start-up listeners run once, and an httpx client bound to it."""
    app = create_app(settings)
    app.asgi = True
    await app._startup()
    await app._server_event("init", "before")
    await app._server_event("init", "after")
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://orchestra.test") as client:
            client.app = app
            yield client
    finally:
        await app._server_event("shutdown", "before")
        await app._server_event("shutdown", "after")


@pytest.fixture
async def client(settings: Settings):
    """In-process client: `await client.post('/api/v1/auth/register', json=...)`;
    `client.app.ctx.core` is the app's Core."""
    async with running_app(settings) as c:
        yield c


# --- users and tokens -----------------------------------------------------------------


class Users:
    """Make users with a role and log them in, for route tests."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.core: Core = client.app.ctx.core

    async def make(self, user_name: str, role: str = "USER", password: str = "password-123") -> dict:
        from orchestra.services import auth
        from orchestra.services.roles import Role

        user = await auth.register(self.core, user_name=user_name, password=password, role=Role(role))
        response = await self.client.post(
            "/api/v1/auth/login", json={"user_name": user_name, "password": password}
        )
        assert response.status_code == 200, response.text
        tokens = response.json()
        return {
            "user_id": user.id,
            "user_name": user.user_name,
            "password": password,
            "access_token": tokens["access_token"],
            "refresh_token": tokens["refresh_token"],
            "headers": {"Authorization": f"Bearer {tokens['access_token']}"},
        }


@pytest.fixture
def users(client) -> Users:
    return Users(client)


# --- a real server process -----------------------------------------------------------


class ServerProcess:
    """`python -m orchestra serve` on a free port, with its own home and store."""

    def __init__(self, home: Path, *, database_url: str | None = None, env: dict | None = None):
        self.home = home
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "ORCHESTRA_HOME": str(home),
            "ORCHESTRA_SECRET_KEY": "e2e-secret-" + "y" * 32,
            **{f"ORCHESTRA_{k.upper()}": str(v) for k, v in {**FAST_HASH, **OPEN_LIMITS}.items()},
            **(env or {}),
        }
        if database_url:
            self.env["ORCHESTRA_DATABASE_URL"] = database_url
        self.proc: subprocess.Popen | None = None
        self.log_path = home / "server.log"

    def cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        """Run an `orchestra` command against the same store."""
        return subprocess.run(
            [sys.executable, "-m", "orchestra", *args],
            env=self.env, input=input, capture_output=True, text=True, timeout=60,
        )

    def start(self, timeout: float = 30.0) -> "ServerProcess":
        current = os.environ.get("ORCHESTRA_TEST_CURRENT", "e2e (outside a test)")
        if not current.startswith("e2e "):
            raise RuntimeError(f"{current} starts a server: mark it @pytest.mark.e2e")
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestra", "serve", "--port", str(self.port)],
            env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                httpx.get(f"{self.base_url}/api/v1/auth/list", timeout=1)
                return self
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not start in {timeout}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def expired(self, token: str) -> str:
        """The same token (user, role, type) as this server would have issued it an hour
        ago, signed with its secret: expired now, without waiting on the clock."""
        import jwt

        from orchestra.services.tokens import TokenService

        claims = jwt.decode(token, options={"verify_signature": False})
        past = TokenService(secret=self.env["ORCHESTRA_SECRET_KEY"], access_ttl=60, refresh_ttl=60,
                            clock=lambda: time.time() - 3600)
        return past.issue(user_id=claims["sub"], name=claims["name"], role=claims["role"],
                          token_type=claims["type"]).token

    def kill(self) -> None:
        """kill -9: no shutdown listeners run."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server(tmp_path: Path):
    """A started server process on SQLite; stopped after the test."""
    proc = ServerProcess(tmp_path / "server-home").start()
    yield proc
    proc.stop()
