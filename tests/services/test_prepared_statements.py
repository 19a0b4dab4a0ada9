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
