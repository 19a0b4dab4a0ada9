"""How a test session shares out the machine (a pytest plugin: `-p tests.parallel` in
pyproject.toml's addopts): pytest-xdist workers, the order work is handed out in, and
what each worker has of its own (a Redis database, a range of ports).

- `pytest -m "not e2e"` (the fast loop) runs in one worker more than there are cores;
  a whole run with the end-to-end tests (CI's plain `pytest`) in `E2E_WORKERS` (4)
  workers, or ORCHESTRA_TEST_WORKERS when that is set, since most of their time is
  spent waiting. `-n N` chooses for itself, `-n 0` keeps one process; a run of named
  files or folders that includes e2e tests stays in one process unless given `-n`.
- Work is handed out in groups (`--dist loadgroup`): the tests of a module that share a
  module-scoped fixture (a server, a browser, a logged-in CLI) go to one worker together,
  so it starts once; every other test, e2e or not, goes wherever a worker is free. A
  test marked `@pytest.mark.xdist_group("name")` runs on one worker with every other test
  of that group, one after the other: the way to keep tests that need something of the
  machine's to themselves apart (none need it today).
- The longest modules start first (`SLOW_FIRST`), then the other e2e modules, then the
  fast tests, which fill the workers' last minutes; a worker takes its next group only
  when it is down to its last test (pytest-xdist's default keeps three in hand, which
  lets one worker queue two long modules while another idles at the end).
- Each worker has its own Redis database (`redis_database`) and its own range of ports
  (`free_port`), so a new e2e module runs in parallel with no set-up of its own;
  PostgreSQL databases are already one per test (tests/conftest.py `PostgresStores`).
"""

from __future__ import annotations

import os
import random
import socket

import pytest

E2E_WORKERS = 4  # on 2 cores: see docs/architecture.md, "Tests", for the measurements

# Modules that take minutes on their own (measured, see docs/architecture.md "Tests"),
# longest first: started first, so that no worker begins one near the end. A module not
# listed here is scheduled after them, e2e before the others, in collection order.
SLOW_FIRST = (
    "tests/e2e/test_openapi_fuzz.py",  # three tests of 4-4.5 min each under four workers' load
    "tests/e2e/test_schedules_e2e.py",
    "tests/e2e/test_store_connections.py",
    "tests/e2e/test_expression_restart.py",
    "tests/e2e/test_docs_walkthrough.py",
    "tests/e2e/test_rolling_restart.py",
)


# --- workers ---------------------------------------------------------------------------


def worker_index() -> int | None:
    """This pytest-xdist worker's number (gw3 is 3), None outside a worker."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def _whole_suite(config) -> bool:
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS or \
        [a.rstrip("/") for a in config.args] == ["tests"]


def choose_workers(config) -> None:
    """Called from tests/conftest.py's `pytest_cmdline_main` (tryfirst): a conftest's hook
    runs before pytest-xdist's own, which reads `-n` and `--dist`; this plugin's would not."""
    if (not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER")
            or config.option.collectonly):
        return
    if config.option.numprocesses is not None:
        pass  # -n chosen on the command line
    elif "not e2e" in (config.option.markexpr or ""):
        # many fast tests wait on a timer or a child process: a third worker fills that time
        config.option.numprocesses = (os.cpu_count() or 1) + 1
    elif _whole_suite(config):
        # most e2e time is spent waiting on servers, leases and streams (docs/architecture.md, "Tests")
        chosen = os.environ.get("ORCHESTRA_TEST_WORKERS", "").strip()
        config.option.numprocesses = int(chosen) if chosen else E2E_WORKERS
    if not config.option.numprocesses:
        return
    if config.option.dist == "no":
        config.option.dist = "loadgroup"
    config.option.loadscopereorder = False  # our order (pytest_collection_modifyitems), not by count


def _shared_by(item) -> str | None:
    """The module (or package) whose tests share a fixture with this one — a server, a
    browser, a logged-in CLI of module scope — or None: the test can go anywhere."""
    info = getattr(item, "_fixtureinfo", None)
    scopes = {d.scope for defs in (info.name2fixturedefs.values() if info else ()) for d in defs}
    path = item.nodeid.split("::", 1)[0]
    if "package" in scopes:
        return path.rsplit("/", 1)[0]
    return path if scopes & {"module", "class"} else None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """After every other plugin (tests/conftest.py marks the e2e tests, xdist reads
    `xdist_group` marks): group each unmarked e2e test by its module, then order."""
    result = yield
    if getattr(config.option, "loadgroup", False):  # set in a worker of a --dist loadgroup run
        for item in items:
            group = None if item.get_closest_marker("xdist_group") else _shared_by(item)
            if group:
                item._nodeid = f"{item.nodeid}@{group}"
    slow = {path: rank for rank, path in enumerate(SLOW_FIRST)}

    def rank(item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path in slow:
            return (0, slow[path])
        return (1, 0) if item.get_closest_marker("e2e") else (2, 0)

    items.sort(key=rank)  # stable: a module's tests stay together and in their order
    return result


@pytest.hookimpl(tryfirst=True)  # before xdist's own (the first answer is taken)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LastTestInHand(LoadGroupScheduling):
        """LoadGroupScheduling that gives a worker its next group only when it holds its
        last test (a worker runs a test once it knows the next one, so not at zero)."""

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return LastTestInHand(config, log)


# --- what a worker has of its own ------------------------------------------------------


def redis_database(base: int = 7) -> int:
    """The Redis database of this worker: `base` outside workers and in the first one,
    then one more per worker (Redis has 16: 0-15; a developer's own data is usually in 0)."""
    number = base + (worker_index() or 0)
    if number > 15:
        raise RuntimeError(f"no Redis database left for worker {worker_index()} (base {base}, 16 in all)")
    return number


PORTS_FROM = 20000  # below Linux's ephemeral range (32768-60999), which bind(0) and connect() use
PORTS_PER_WORKER = 2000  # outside a worker 20000-21999, worker gw0 22000-23999, ... gw4 up to 31999
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now, from this process's own range: no other worker of the
    session gets it, nor an outgoing connection (they take ports from the ephemeral range),
    and never the same one twice in a process. Other sessions on the machine may use the
    same range: the port is tried before it is handed out, and the start is random."""
    index = worker_index()
    first = PORTS_FROM + PORTS_PER_WORKER * (index + 1 if index is not None else 0)
    if first + PORTS_PER_WORKER > 32768:
        raise RuntimeError(f"no port range left for worker {index}")
    offset = random.randrange(PORTS_PER_WORKER)
    for _ in range(2):
        for step in range(PORTS_PER_WORKER):
            port = first + (offset + step) % PORTS_PER_WORKER
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:  # in use, or in TIME_WAIT after an earlier test's server
                    continue
            _handed_out.add(port)
            return port
        _handed_out.clear()  # every one handed out once: the earliest are long free again
    raise RuntimeError(f"no free port in {first}-{first + PORTS_PER_WORKER - 1}")
