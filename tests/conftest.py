"""Shared fixtures: settings on a temp home, stores (SQLite file, PostgreSQL database),
the in-process app client, and a real `orchestra serve` process for end-to-end tests.

Each test gets a fresh, migrated, empty store. SQLite: a copy of one file migrated once per
session. PostgreSQL, with ORCHESTRA_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test):
a database of the session's, migrated once and emptied after each test (`PostgresStores`),
all dropped when the session ends. Without the variable they skip and say
why; with it set, an unreachable server FAILS them, so CI cannot go green by losing
every PostgreSQL variant (likewise ORCHESTRA_TEST_REDIS_URL for the Redis tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx
import pytest
from sanic import Sanic
from sanic.router import Router

from orchestra.core import Core
from orchestra.settings import Settings
from orchestra.web.app import create_app
from tests import warm_cli

# Cheap argon2 parameters: the tests exercise the real hasher, not its cost.
FAST_HASH = {"argon2_time_cost": 1, "argon2_memory_cost": 1024, "argon2_parallelism": 1}
# Generous limits by default; rate-limit tests set their own.
OPEN_LIMITS = {"rate_limit_register": "10000/minute", "rate_limit_login": "10000/minute"}
# The fake model and fake MCP servers listen on loopback, which the egress rule refuses
# by default (SPEC §14): the tests allow it; the egress tests set their own.
LOOPBACK_EGRESS = {"egress_allow": "127.0.0.0/8,::1"}
# HTTP steps and subscriptions obey their own rule (SPEC §15b, ORCHESTRA_STEP_EGRESS_ALLOW),
# which the provider allowance above does not open. In-process tests whose steps or
# subscriptions call a loopback server set it in their `settings_overrides`; a real server
# process (CLI, console and e2e tests, whose fakes all listen on loopback) gets it by
# default, and a test of the step rule's default sets it to "" again.
LOOPBACK_STEPS = {"step_egress_allow": "127.0.0.0/8,::1"}

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
def pytest_cmdline_main(config) -> None:
    """How many pytest-xdist workers, and how work is shared out (tests/parallel.py)."""
    from tests.parallel import choose_workers

    choose_workers(config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    # In the environment, not a global: tests import this file as `tests.conftest`, a
    # second copy of the module pytest loaded as `conftest`.
    os.environ["ORCHESTRA_TEST_CURRENT"] = ("e2e " if item.get_closest_marker("e2e") else "") + item.nodeid


# ORCHESTRA_TEST_REQUIRE_ALL=1 (set by .ci/run): a skipped test fails the session, so CI
# cannot go green while a promised family (PostgreSQL, Redis, Chromium, schemathesis)
# quietly did not run.
_skipped: list[str] = []
_skip_reasons: Counter[str] = Counter()  # a reason: how many tests it skipped


def _skip_reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(f"{report.nodeid}: {_skip_reason(report)}")
        _skip_reasons[_skip_reason(report)] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    """Skips as one line a reason, with how many (pyproject's `-rfE` leaves them out of the
    short summary: a clone without PostgreSQL skips hundreds, and `-ra` gave a line each)."""
    if not _skip_reasons:
        return
    terminalreporter.write_sep("-", f"{sum(_skip_reasons.values())} skipped")
    ranked = _skip_reasons.most_common()
    for reason, count in ranked[:10]:
        terminalreporter.write_line(f"{count:>5} × {reason}")
    if len(ranked) > 10:
        terminalreporter.write_line(f"      … and {len(ranked) - 10} other reasons (-rs lists each test)")


def pytest_collectreport(report) -> None:
    """A module skipped as a whole while collected (`pytest.skip(allow_module_level=True)`,
    `importorskip`): none of its tests is even reported, so it counts here."""
    if report.skipped:
        _skipped.append(f"{report.nodeid or '(collection)'}: {_skip_reason(report)} (the whole module)")
        _skip_reasons[f"{_skip_reason(report)} (a whole module)"] += 1


def pytest_sessionfinish(session, exitstatus) -> None:
    if os.environ.get("ORCHESTRA_TEST_REQUIRE_ALL") == "1" and _skipped and exitstatus in (
            pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\nORCHESTRA_TEST_REQUIRE_ALL=1 and these tests were skipped:", file=sys.stderr)
        for line in _skipped[:50]:
            print(f"  {line}", file=sys.stderr)


def free_port() -> int:
    """A free loopback port of this worker's own range (tests/parallel.py)."""
    from tests.parallel import free_port as of_this_worker

    return of_this_worker()


# --- stores ---------------------------------------------------------------------------


def _migrate(url: str, home: Path) -> None:
    """Apply every migration to the (empty) store at `url`, as `Core.open` does."""

    async def go() -> None:
        core = await Core.open(make_settings(home, url))
        await core.close()

    asyncio.run(go())


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory) -> Path:
    """One SQLite store migrated once per session; each test gets a copy of the file."""
    folder = tmp_path_factory.mktemp("sqlite-template")
    path = folder / "store" / "orchestra.db"
    _migrate(f"sqlite:///{path}", folder / "home")
    for suffix in ("-wal", "-shm"):  # closed cleanly: everything is in the main file
        assert not path.with_name(path.name + suffix).exists() or not path.with_name(path.name + suffix).stat().st_size
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, _sqlite_template: Path) -> str:
    """A fresh SQLite store for one test: a copy of the session's migrated, empty file
    (what migrating a new file gives, at a file copy's cost)."""
    path = tmp_path / "store" / "orchestra.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


def _postgres_base_url() -> str | None:
    return os.environ.get("ORCHESTRA_TEST_POSTGRES_URL") or None


async def _pg_admin(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=5)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _with_database(base: str, name: str) -> str:
    return urlunparse(urlparse(base)._replace(path=f"/{name}"))


# What a test could change in a database besides its rows: tables, columns, indexes,
# constraints, sequences, functions and triggers of the public schema, the applied
# migrations, schemas, extensions and the database's own settings. A database whose shape a test
# changed is dropped, not reused.
_PG_SHAPE = """
SELECT md5(coalesce(string_agg(item, E'\n' ORDER BY item), '')) FROM (
  SELECT 'rel ' || c.relname || ' ' || c.relkind::text FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
  UNION ALL SELECT 'col ' || table_name || '.' || column_name || ' ' || data_type || ' '
    || is_nullable || ' ' || coalesce(column_default, '')
    FROM information_schema.columns WHERE table_schema = 'public'
  UNION ALL SELECT 'idx ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
  UNION ALL SELECT 'con ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
    WHERE connamespace = 'public'::regnamespace
  UNION ALL SELECT 'fn ' || p.proname || ' ' || md5(p.prosrc) FROM pg_proc p
    WHERE p.pronamespace = 'public'::regnamespace
  UNION ALL SELECT 'trg ' || tgname || ' ' || tgrelid::regclass::text || ' ' || tgenabled::text
    FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT 'mig ' || name FROM schema_migration
  UNION ALL SELECT 'ext ' || extname FROM pg_extension
  UNION ALL SELECT 'db ' || datconnlimit::text || ' ' || datallowconn::text FROM pg_database
    WHERE datname = current_database()
  UNION ALL SELECT 'set ' || array_to_string(setconfig, ',') FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT 'nsp ' || nspname FROM pg_namespace
    WHERE nspname NOT LIKE 'pg\\_%' AND nspname NOT IN ('information_schema', 'public')
) AS shape(item)
"""


class PostgresStores:
    """Fresh PostgreSQL stores for the tests of one session.

    `CREATE DATABASE` costs ~0.4 s here whatever it copies (the server writes and syncs
    the new database's catalogs), and migrating it ~0.15 s more: most of the fast loop
    once. So the session migrates one database, and a test's store is a database that
    holds that schema and no rows: a spare one (a copy of the migrated one, made once),
    or one an earlier test used, emptied when that test ended: its other connections
    ended, every table but `schema_migration` emptied, its sequences restarted. A
    database whose shape (tables, columns, indexes, constraints, functions, triggers)
    differs from the migrated one's afterwards is dropped instead. Each database is
    dropped when the session ends."""

    def __init__(self, base: str, home: Path) -> None:
        self.base = base
        self.home = home
        self.session = uuid.uuid4().hex[:8]
        self.template = f"orchestra_test_{self.session}_template"
        self.spare: list[str] = []  # empty, migrated, ready for a test
        self.made: set[str] = set()
        self.shape: str | None = None
        self.tables: list[str] = []
        self.sequences: list[tuple[str, int, bool]] = []  # name, last_value, is_called
        self.numbers = itertools.count(1)

    async def _connect(self, name: str | None = None):
        import asyncpg

        return await asyncpg.connect(self.base if name is None else _with_database(self.base, name), timeout=5)

    def start(self) -> None:
        asyncio.run(_pg_admin(self.base, f'CREATE DATABASE "{self.template}"'))
        self.made.add(self.template)
        _migrate(_with_database(self.base, self.template), self.home)

        async def describe() -> None:
            conn = await self._connect(self.template)
            try:
                self.shape = await conn.fetchval(_PG_SHAPE)
                self.tables = [r[0] for r in await conn.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename <> 'schema_migration' ORDER BY tablename")]
                self.sequences = []
                for (sequence,) in await conn.fetch(
                        "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' "
                        "AND sequencename <> 'schema_migration_id_seq' ORDER BY sequencename"):
                    row = await conn.fetchrow(f'SELECT last_value, is_called FROM "{sequence}"')
                    self.sequences.append((sequence, row["last_value"], row["is_called"]))
                assert not await conn.fetchval(
                    "SELECT count(*) FROM (" + " UNION ALL ".join(
                        f'SELECT 1 FROM "{t}"' for t in self.tables) + ") AS rows"), "migrations left rows"
            finally:
                await conn.close()

        asyncio.run(describe())
        if not asyncio.run(self._disconnect(self.template)):
            raise RuntimeError(f"connections to {self.template} did not end")

    async def _disconnect(self, name: str) -> bool:
        """End every connection to `name` (as DROP DATABASE ... WITH (FORCE) does)."""
        admin = await self._connect()
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = $1 AND pid <> pg_backend_pid()", name)
            for _ in range(250):
                if not await admin.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name):
                    return True
                await asyncio.sleep(0.02)
            return False
        finally:
            await admin.close()

    def take(self) -> str:
        if self.spare:
            return self.spare.pop()
        name = f"orchestra_test_{self.session}_{next(self.numbers)}"
        asyncio.run(_pg_admin(self.base, f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        self.made.add(name)
        return name

    def give_back(self, name: str) -> None:
        """Empty `name` for the next test, or drop it if it cannot be made like new."""
        if asyncio.run(self._empty(name)):
            self.spare.append(name)
        else:
            asyncio.run(_pg_admin(self.base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            self.made.discard(name)

    async def _empty(self, name: str) -> bool:
        if not await self._disconnect(name):  # what the test's processes and pools left
            return False
        conn = await self._connect(name)
        try:
            if await conn.fetchval(_PG_SHAPE) != self.shape:
                return False
            if await conn.fetchval("SELECT count(*) FROM pg_prepared_xacts WHERE database = $1", name):
                return False
            async with conn.transaction():
                # Every table at once, so no foreign key or trigger runs (DELETE rather
                # than TRUNCATE: TRUNCATE makes new files, which costs as much as a new
                # database here).
                await conn.execute("SET LOCAL session_replication_role = replica")
                for table in self.tables:
                    await conn.execute(f'DELETE FROM "{table}"')
                # setval, not ALTER SEQUENCE ... RESTART (a new file again)
                for sequence, last_value, is_called in self.sequences:
                    await conn.execute("SELECT setval($1::regclass, $2, $3)",
                                       f'"{sequence}"', last_value, is_called)
            return True
        except Exception:  # noqa: BLE001 - not like new: the next test gets another
            return False
        finally:
            await conn.close()

    def close(self) -> None:
        for name in sorted(self.made, key=lambda made: made == self.template):  # the template last
            asyncio.run(_pg_admin(self.base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.made.clear()
        self.spare.clear()


@pytest.fixture(scope="session")
def _postgres_stores(tmp_path_factory):
    base = _postgres_base_url()
    if base is None:
        pytest.skip("PostgreSQL tests need ORCHESTRA_TEST_POSTGRES_URL (see .ci/run)")
    stores = PostgresStores(base, tmp_path_factory.mktemp("postgres-template"))
    try:
        stores.start()
    except Exception as exc:  # noqa: BLE001 - configured but unusable: a failure, not a skip
        with contextlib.suppress(Exception):  # the failure below says why
            stores.close()
        pytest.fail(
            f"ORCHESTRA_TEST_POSTGRES_URL is set but PostgreSQL at {base} cannot be used: {exc!r}",
            pytrace=False,
        )
    yield stores
    stores.close()


@pytest.fixture
def postgres_url(_postgres_stores: PostgresStores):
    """A fresh PostgreSQL store for one test: migrated, no rows (see `PostgresStores`)."""
    name = _postgres_stores.take()
    yield _with_database(_postgres_stores.base, name)
    _postgres_stores.give_back(name)


@pytest.fixture
def blank_postgres_url(_postgres_stores: PostgresStores):
    """A new PostgreSQL database with no tables at all, dropped afterwards: for a test of
    what the migrations do to a store (`postgres_url` gives one already migrated)."""
    base = _postgres_stores.base
    name = f"orchestra_test_{_postgres_stores.session}_blank_{next(_postgres_stores.numbers)}"
    asyncio.run(_pg_admin(base, f'CREATE DATABASE "{name}"'))
    yield _with_database(base, name)
    asyncio.run(_pg_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """The store of a test; modules that run on both stores override this fixture."""
    return sqlite_url


@pytest.fixture(params=["sqlite", "postgres"])
def both_stores(request) -> str:
    """Parametrise a test (or, by overriding `database_url`, a module) over both stores."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
def _fake_mcp_process():
    """The session's fake MCP server process, started on first use; tests reach it
    through the `fake_mcp` fixture below."""
    from orchestra.testing.fake_mcp import (
        FakeMcpProcess,  # here: importing the MCP SDK takes ~0.7 s
    )

    server = FakeMcpProcess()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_mcp(_fake_mcp_process):
    """This test's view (tests/fakes/fake_mcp.FakeMcpView) of the session's fake MCP
    server: its counters start at zero for the test."""
    from tests.fakes.fake_mcp import FakeMcpView

    return FakeMcpView(_fake_mcp_process)


@pytest.fixture
def fake_llm():
    """A running fake OpenAI-compatible server (tests/fakes/fake_llm.FakeLLM; echo mode,
    no delays); `fake_llm.base_url` is its `/v1` URL."""
    from tests.fakes.fake_llm import FakeLLM

    with FakeLLM() as fake:
        yield fake


# --- settings, core, app --------------------------------------------------------------


@pytest.fixture
def settings_overrides() -> dict:
    """Override in a module or test to change settings for its app/core."""
    return {}


@pytest.fixture
def settings(tmp_path: Path, database_url: str, settings_overrides: dict) -> Settings:
    return make_settings(tmp_path / "home", database_url, **settings_overrides)


def make_settings(home: Path, database_url: str, **overrides) -> Settings:
    values = {**FAST_HASH, **OPEN_LIMITS, **LOOPBACK_EGRESS, "secret_key": "test-secret-" + "x" * 32,
              **overrides}
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
    if getattr(Sanic, "__touched__", False):
        # Sanic's touch-up rewrites its own class methods (process-wide) to skip signals
        # nobody handles. Every app here has the same signals, so the first app's rewrite
        # is what each later one would make again (~14 ms each): keep it. Requests still
        # run the rewritten methods, as in production.
        app.config.TOUCHUP = False
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
        # Sanic keeps apps in a registry by name and routers in two class-level caches
        # (up to 1,024 each): let this test's app go, or a session holds every one of them
        # and each full garbage collection walks them all.
        Sanic.unregister_app(app)
        Router.get.cache_clear()
        Router.find_route_by_view_name.cache_clear()


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
            **{f"ORCHESTRA_{k.upper()}": str(v)
               for k, v in {**FAST_HASH, **OPEN_LIMITS, **LOOPBACK_EGRESS, **LOOPBACK_STEPS}.items()},
            **(env or {}),
        }
        if database_url:
            self.env["ORCHESTRA_DATABASE_URL"] = database_url
        self.proc: warm_cli.WarmProcess | None = None
        self.log_path = home / "server.log"

    def cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        """Run an `orchestra` command against the same store (a process of its own,
        forked from a warm interpreter: tests/warm_cli.py)."""
        return warm_cli.run(list(args), env=self.env, input=input, timeout=60)

    def start(self, timeout: float = 90.0) -> ServerProcess:
        # 90 s: importing the server takes ~3 s of CPU, and tens of seconds of wall time on a
        # 2-core machine that runs parallel workers and other sessions' tests (load 15-20)
        current = os.environ.get("ORCHESTRA_TEST_CURRENT", "e2e (outside a test)")
        if not current.startswith("e2e "):
            raise RuntimeError(f"{current} starts a server: mark it @pytest.mark.e2e")
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own copy
            # forked from a warm interpreter (tests/warm_cli.py): a process of its own,
            # without the 1.2-1.5 s of CPU a fresh one spends importing the server
            self.proc = warm_cli.start(["serve", "--port", str(self.port)], env=self.env,
                                       output=log.fileno())
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
