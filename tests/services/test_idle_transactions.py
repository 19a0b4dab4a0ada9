"""A process frozen inside a transaction (SIGSTOP, a paused VM) must not keep its row
locks: on PostgreSQL the store's connections ask the server to end a session left idle in
a transaction past `idle_transaction_timeout` (the run lease: `core.py`), so the process
taking its runs over is not kept waiting on them for as long as the owner is frozen."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from orchestra.db.database import make_database, postgres_params
from orchestra.db.outage import is_unreachable


async def test_a_transaction_left_idle_is_ended_and_its_row_locks_released(postgres_url):
    frozen = make_database(postgres_url, pool_size=1, idle_transaction_timeout=1.0)
    other = await asyncpg.connect(**postgres_params(postgres_url))
    try:
        await other.execute("CREATE TABLE lease (id int PRIMARY KEY, owner text)")
        await other.execute("INSERT INTO lease VALUES (1, 'a')")
        with pytest.raises(Exception) as caught:
            async with frozen.atomic():
                await frozen.aexecute_sql("UPDATE lease SET owner = %s WHERE id = %s", ("a", 1))
                began = time.monotonic()
                # the takeover: waits on the frozen transaction's row lock until the server ends it
                taken = await asyncio.wait_for(
                    other.execute("UPDATE lease SET owner = 'b' WHERE id = 1"), timeout=10)
                waited = time.monotonic() - began
                await frozen.aexecute_sql("SELECT 1")  # the owner wakes: its session is gone
        assert taken == "UPDATE 1"
        assert 0.9 <= waited < 10, waited
        # the owner's store reads its ended session as a passing outage (retried, or 503)
        assert is_unreachable(caught.value), repr(caught.value)
        assert await other.fetchval("SELECT owner FROM lease WHERE id = 1") == "b"
        assert (await frozen.aexecute_sql("SELECT 1")).fetchall() == [(1,)]  # a fresh session
    finally:
        await other.execute("DROP TABLE IF EXISTS lease")
        await other.close()
        await frozen.close_pool()


async def test_without_the_timeout_the_session_keeps_the_server_default(postgres_url):
    db = make_database(postgres_url, pool_size=1)
    try:
        shown = (await db.aexecute_sql("SHOW idle_in_transaction_session_timeout")).fetchall()
        assert shown == [("0",)]
    finally:
        await db.close_pool()
