"""PostgreSQL connections keep their statements prepared (`db/database.py`); a migration
run by another process (a rolling upgrade) may change a table under one of them."""

from __future__ import annotations

import asyncpg
import pytest

from orchestra.db.database import make_database, postgres_params
from orchestra.db.outage import is_unreachable


async def test_a_statement_outdated_by_another_process_migration_is_tried_again(postgres_url):
    db = make_database(postgres_url, pool_size=1)
    other = await asyncpg.connect(**postgres_params(postgres_url))
    try:
        await db.aexecute_sql("CREATE TABLE gauge (id int PRIMARY KEY, v int)")
        await db.aexecute_sql("INSERT INTO gauge VALUES (1, 10)")
        async with db.atomic():  # prepared and cached on the pool's one connection
            assert (await db.aexecute_sql("SELECT * FROM gauge")).fetchall() == [(1, 10)]
        await db.aclose()

        await other.execute("ALTER TABLE gauge ADD COLUMN w int DEFAULT 7")
        # Inside a transaction the outdated statement fails; the error counts as a passing
        # store trouble (the engine waits and tries again, a request gets 503), and asyncpg
        # has dropped its cache, so the next try prepares afresh.
        with pytest.raises(Exception) as caught:
            async with db.atomic():
                await db.aexecute_sql("SELECT * FROM gauge")
        assert is_unreachable(caught.value), repr(caught.value)
        async with db.atomic():
            assert (await db.aexecute_sql("SELECT * FROM gauge")).fetchall() == [(1, 10, 7)]

        await other.execute("ALTER TABLE gauge ADD COLUMN x int DEFAULT 8")
        # Outside a transaction asyncpg prepares again by itself.
        assert (await db.aexecute_sql("SELECT * FROM gauge")).fetchall() == [(1, 10, 7, 8)]
        await db.aclose()
    finally:
        await other.close()
        await db.close_pool()


async def test_statements_stay_prepared_through_asyncpgs_public_calls(postgres_url):
    """Rows and row counts come through asyncpg's public `fetch` and `execute` (its
    private `_execute`, which any release may change, is not used), and a statement run
    again is not prepared again: the connection holds one prepared statement for it."""
    import inspect

    from orchestra.db import database

    assert "._execute(" not in inspect.getsource(database._CachedStatementConnection)
    db = make_database(postgres_url, pool_size=1)
    try:
        await db.aexecute_sql("CREATE TABLE meter (id int PRIMARY KEY, v int)")
        async with db.atomic():  # one connection for all of it
            inserted = await db.aexecute_sql(
                "INSERT INTO meter VALUES (%s, %s), (%s, %s) RETURNING id", (1, 10, 2, 20))
            assert inserted.fetchall() == [(1,), (2,)]
            for _ in range(3):
                changed = await db.aexecute_sql("UPDATE meter SET v = v + %s WHERE v > %s", (1, 5))
                assert changed.rowcount == 2
            none = await db.aexecute_sql("UPDATE meter SET v = %s WHERE id = %s", (0, 99))
            assert none.rowcount == 0
            rows = await db.aexecute_sql("SELECT id, v FROM meter ORDER BY id")
            assert rows.fetchall() == [(1, 13), (2, 23)]
            prepared = await db.aexecute_sql(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ("UPDATE meter SET v = v + %",))
            assert prepared.fetchall() == [(1,)]
    finally:
        await db.aexecute_sql("DROP TABLE IF EXISTS meter")
        await db.close_pool()
