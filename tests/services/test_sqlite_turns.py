"""On SQLite a process's writers take turns and its reads never wait behind them
(db/database.py: `WriteTurns`, the readers of `SettlingSqliteDatabase`). Found by the
hostile benchmark: one user starting 20 runs at once held every pooled connection with
writers polling for SQLite's lock, and another user's reads waited 0.5 s for one."""

from __future__ import annotations

import asyncio

import pytest
from peewee import OperationalError

from orchestra.db.database import make_database


@pytest.fixture
async def db(tmp_path):
    store = make_database(f"sqlite:///{tmp_path / 'turns.db'}", pool_size=2, busy_timeout=0.5)
    await store.aexecute_sql("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT)")
    await store.aexecute_sql("INSERT INTO item (name) VALUES ('first')")
    await store.aclose()
    yield store
    await store.close_pool()


async def _hold_a_write(db, started: asyncio.Event, done: asyncio.Event, name: str) -> None:
    async with db.atomic(lock_type="IMMEDIATE"):
        await db.aexecute_sql("INSERT INTO item (name) VALUES (?)", (name,))
        started.set()
        await done.wait()


async def test_a_read_is_answered_while_writers_hold_every_pooled_connection(db):
    done = asyncio.Event()
    holding, queued = asyncio.Event(), asyncio.Event()
    writers = [asyncio.create_task(_hold_a_write(db, holding, done, "held")),
               asyncio.create_task(_hold_a_write(db, queued, done, "queued"))]
    await holding.wait()
    await asyncio.sleep(0.05)  # the second writer holds the other connection, waiting its turn
    try:
        async def read() -> list:
            return (await db.aexecute_sql("SELECT name FROM item ORDER BY id")).fetchall()

        # both pooled connections are held: the read is answered by a reader, as of the last commit
        assert await asyncio.wait_for(asyncio.create_task(read()), timeout=5) == [("first",)]
        assert not queued.is_set()
    finally:
        done.set()
        await asyncio.gather(*writers)

    async def names() -> list:
        return (await db.aexecute_sql("SELECT name FROM item ORDER BY id")).fetchall()

    assert await asyncio.create_task(names()) == [("first",), ("held",), ("queued",)]


async def test_a_writer_whose_turn_does_not_come_fails_as_a_locked_store_and_writes_nothing(db):
    done, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold_a_write(db, holding, done, "held"))
    await holding.wait()

    async def late() -> None:
        await db.aexecute_sql("INSERT INTO item (name) VALUES ('late')")

    try:
        with pytest.raises(OperationalError, match="database is locked"):
            await asyncio.create_task(late())
    finally:
        done.set()
        await holder

    async def names() -> list:
        return [row[0] for row in (await db.aexecute_sql("SELECT name FROM item ORDER BY id")).fetchall()]

    assert await asyncio.create_task(names()) == ["first", "held"]


async def test_a_turn_is_handed_on_after_its_writer_is_cancelled_mid_transaction(db):
    done, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold_a_write(db, holding, done, "cancelled"))
    await holding.wait()
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder

    async def after() -> list:
        await db.aexecute_sql("INSERT INTO item (name) VALUES ('next')")
        return [row[0] for row in (await db.aexecute_sql("SELECT name FROM item ORDER BY id")).fetchall()]

    # within the busy timeout (0.5 s): the cancelled transaction was rolled back, its turn passed on
    assert await asyncio.wait_for(asyncio.create_task(after()), timeout=5) == ["first", "next"]


async def test_many_writers_at_once_all_commit(db):
    async def write(n: int) -> None:
        async with db.atomic(lock_type="IMMEDIATE"):
            await db.aexecute_sql("INSERT INTO item (name) VALUES (?)", (f"w{n}",))
        await db.aclose()

    await asyncio.gather(*(asyncio.create_task(write(n)) for n in range(60)))

    async def count() -> int:
        return (await db.aexecute_sql("SELECT count(*) FROM item")).fetchall()[0][0]

    assert await asyncio.create_task(count()) == 61


async def test_a_read_on_a_reader_is_seen_by_the_query_hooks(db):
    """Statement counts (tests, observability) see every read, a reader's included."""
    seen: list[str] = []
    db.query_hooks.append(lambda event: seen.append(event.sql))

    async def read() -> list:
        assert db._state.conn is None  # nothing held: this read goes to a reader
        return (await db.aexecute_sql("SELECT name FROM item")).fetchall()

    assert await asyncio.create_task(read()) == [("first",)]
    assert seen == ["SELECT name FROM item"]
