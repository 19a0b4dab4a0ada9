"""Login floods: the 503 comes before any store work, and hashing yields the CPU."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from orchestra.errors import OverloadedError, UserNotExistError
from orchestra.services import auth
from orchestra.services.passwords import HASH_NICENESS, PasswordService


@pytest.fixture
def settings_overrides() -> dict:
    # One slow hashing slot and no queue: a second hash is refused while one runs.
    return {"hash_concurrency": 1, "hash_queue": 0, "argon2_time_cost": 4,
            "argon2_memory_cost": 32768, "argon2_parallelism": 1}


async def test_overloaded_login_is_503_before_the_user_is_looked_up(core):
    await auth.register(core, user_name="known_user", password="password-123")
    with pytest.raises(UserNotExistError):  # not overloaded: the ordinary answer
        await auth.login(core, user_name="nobody_here", password="password-123")
    busy = asyncio.ensure_future(auth.login(core, user_name="known_user", password="password-123"))
    deadline = asyncio.get_running_loop().time() + 10
    while not core.passwords._in_flight:  # until the first login holds the one hashing slot
        assert not busy.done() and asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.001)
    with pytest.raises(OverloadedError) as refused:
        await auth.login(core, user_name="nobody_here", password="password-123")
    assert refused.value.headers["Retry-After"] == "1"
    with pytest.raises(OverloadedError):
        await auth.register(core, user_name="another_user", password="password-123")
    pair = await busy
    assert pair.access_token
    with pytest.raises(UserNotExistError):  # capacity is back
        await auth.login(core, user_name="nobody_here", password="password-123")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux only")
def test_hashing_threads_run_at_a_lower_priority():
    service = PasswordService(time_cost=1, memory_cost=1024, parallelism=1, concurrency=2)
    try:
        nice = service._executor.submit(
            lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        ).result(timeout=10)
        caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        assert nice == min(19, caller + HASH_NICENESS)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == caller  # unchanged
    finally:
        service.close()
