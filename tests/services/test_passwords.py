"""PasswordService: real argon2id in a bounded thread pool, never on the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
from argon2 import PasswordHasher

from orchestra.errors import OverloadedError
from orchestra.services.passwords import PasswordService

CHEAP = {"time_cost": 1, "memory_cost": 1024, "parallelism": 1}


@pytest.fixture
def service():
    svc = PasswordService(**CHEAP, concurrency=2, queue=4)
    yield svc
    svc.close()


async def test_hash_is_argon2id_with_the_configured_parameters(service):
    hashed = await service.hash("secret-password")
    assert hashed.startswith("$argon2id$v=19$m=1024,t=1,p=1$")
    assert "secret-password" not in hashed
    assert await service.verify(hashed, "secret-password")
    assert not await service.verify(hashed, "wrong-password")


async def test_verify_is_false_for_a_garbage_hash(service):
    assert not await service.verify("not-a-hash", "x")
    assert not await service.verify("$argon2id$v=19$m=1024,t=1,p=1$bad$bad", "x")


async def test_needs_rehash_compares_parameters(service):
    current = await service.hash("pw-12345678")
    assert not service.needs_rehash(current)
    older = PasswordHasher(time_cost=2, memory_cost=2048, parallelism=1).hash("pw-12345678")
    assert service.needs_rehash(older)
    assert service.needs_rehash("garbage")


async def test_hashing_runs_in_the_pool_threads_not_the_loop(service):
    names = []

    class Recording(PasswordHasher):
        def hash(self, password, *, salt=None):
            names.append(threading.current_thread().name)
            return super().hash(password, salt=salt)

    service._hasher = Recording(**CHEAP)  # the real argon2 hasher, which notes its thread
    await asyncio.gather(*(service.hash("pw-12345678") for _ in range(4)))
    assert len(names) == 4 and all(n.startswith("argon2") for n in names), names


async def test_past_the_queue_callers_get_overloaded_at_once():
    svc = PasswordService(time_cost=3, memory_cost=16384, parallelism=1, concurrency=1, queue=2)
    try:
        results = await asyncio.gather(*(svc.hash("pw-12345678") for _ in range(8)), return_exceptions=True)
        refused = [r for r in results if isinstance(r, OverloadedError)]
        done = [r for r in results if isinstance(r, str)]
        assert len(done) == 3 and len(refused) == 5, results  # 1 running + 2 queued
        assert refused[0].headers["Retry-After"] == "1" and refused[0].status == 503
        assert svc._in_flight == 0  # the counter comes back down
        assert isinstance(await svc.hash("pw-12345678"), str)
    finally:
        svc.close()


def test_concurrency_defaults_to_the_core_count():
    import os

    svc = PasswordService(**CHEAP)
    try:
        assert svc.concurrency == (os.cpu_count() or 1)
    finally:
        svc.close()
