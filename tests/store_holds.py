"""No task waits while it holds a pooled store connection (a pytest plugin: `-p
tests.store_holds` in pyproject.toml's addopts; SPEC §15b, issue "Trust, second pass").

playhouse.pwasyncio binds a pooled connection to the task that used it until the task
gives it back; a task that then sleeps, or waits for an event (a reply, a child run, a
budget, a wake-up), keeps a connection from everyone else for as long as it waits, and a
few such tasks empty the pool. This plugin makes that a test failure on every code path
the in-process tests reach, today's and future ones: while a test runs, `asyncio.sleep`
(of more than zero seconds), `asyncio.Event.wait` and `asyncio.Condition.wait` (when they
would wait) look whether the current task holds a connection of any database opened in
this process, and the test fails naming where it waited. (Server processes of the e2e
tests are not watched: their code paths are the same ones the route tests reach here.
Nor is a test with two stores open at once: see `_holds_a_connection`.)
"""

from __future__ import annotations

import asyncio
import sys
import traceback
import weakref
from pathlib import Path

import pytest
from playhouse.pwasyncio import AsyncDatabaseMixin

_databases: weakref.WeakSet = weakref.WeakSet()
_found: list[str] = []
_watching = False


def _track(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _databases.add(self)

    return __init__


def _holds_a_connection() -> bool:
    try:
        if asyncio.current_task() is None:
            return False
    except RuntimeError:  # no running loop
        return False
    shared = [db for db in list(_databases)
              if not getattr(db, "dedicated", False)  # a pool of its own for one task (the lease loop's)
              and getattr(db, "_pool", None) is not None]  # open
    if len(shared) > 1:
        # Two stores open in one process (a test's `core` beside its app's): the models'
        # queries go to whichever was bound last, which a real process never has.
        return False
    for db in shared:
        current = getattr(getattr(db, "_state", None), "_current", None)
        state = current() if current is not None else None
        if state is not None and state.conn is not None:
            return True
    return False


ORCHESTRA = str(Path(__file__).resolve().parents[1] / "orchestra")


def _check(what: str) -> None:
    """Note a wait of orchestra's code (the caller of sleep/wait is in the package; a test
    that holds a connection on purpose and sleeps is not a finding)."""
    caller = sys._getframe(2).f_code.co_filename  # _check <- _watched_* <- the caller
    if _watching and caller.startswith(ORCHESTRA) and _holds_a_connection():
        frames = [f for f in traceback.extract_stack()[:-2] if f.filename.startswith(ORCHESTRA)]
        where = " <- ".join(f"{f.filename.rsplit('/orchestra/', 1)[-1]}:{f.lineno} ({f.name})"
                            for f in reversed(frames[-4:]))
        _found.append(f"{what} while holding a store connection: {where or 'outside orchestra'}")


_sleep = asyncio.sleep
_event_wait = asyncio.Event.wait
_condition_wait = asyncio.Condition.wait


async def _watched_sleep(delay, result=None):
    if delay and delay > 0:
        _check(f"asyncio.sleep({delay!r})")
    return await _sleep(delay, result)


async def _watched_event_wait(self):
    if not self.is_set():
        _check("Event.wait()")
    return await _event_wait(self)


async def _watched_condition_wait(self):
    _check("Condition.wait()")
    return await _condition_wait(self)


AsyncDatabaseMixin.__init__ = _track(AsyncDatabaseMixin.__init__)
asyncio.sleep = _watched_sleep
asyncio.Event.wait = _watched_event_wait
asyncio.Condition.wait = _watched_condition_wait


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Watch the test's own body (fixtures' set-up and tear-down may hold a connection on
    purpose, e.g. to lock the store for a test)."""
    global _watching
    _found.clear()
    _watching = True
    try:
        result = yield
    finally:
        _watching = False
    if _found:
        unique = list(dict.fromkeys(_found))
        pytest.fail("a task waited while holding a pooled store connection:\n  " + "\n  ".join(unique[:10]),
                    pytrace=False)
    return result
