"""A process's copies are untrusted while its LISTEN socket holds bytes it has not read:
a NOTIFY that reached the machine, or the server closing the connection (db/signals.py).
Without this, a request the event loop served before handling them was answered from a
copy a revocation had just made stale."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg

from orchestra.db.database import postgres_params
from orchestra.db.signals import LISTENER_NAME, PostgresSignals


def _behind_the_loops_back(url: str, sql: str, *args) -> None:
    """Run `sql` from another thread while this event loop stands still, then give the
    server's answer to the LISTEN socket time to reach this machine: the loop has not
    read it when this returns."""
    async def send() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql, *args)
        finally:
            await conn.close()

    thread = threading.Thread(target=asyncio.run, args=(send(),))
    thread.start()
    thread.join()
    time.sleep(0.3)


def test_a_signal_not_yet_handled_makes_the_copies_untrusted(postgres_url):
    async def scenario() -> None:
        signals = PostgresSignals(postgres_params(postgres_url))
        heard: list[str] = []
        signals.on("cache", heard.append)
        await signals.start()
        try:
            assert signals.connected
            _behind_the_loops_back(postgres_url, "SELECT pg_notify('orchestra_cache', 'refresh_token')")
            assert heard == [] and not signals.connected  # on its way in: read the store
            for _ in range(50):
                if heard:
                    break
                await asyncio.sleep(0.01)
            assert heard == ["refresh_token"] and signals.connected
        finally:
            await signals.stop()

    asyncio.run(scenario())


def test_a_cut_listen_connection_is_untrusted_before_the_loop_hears_of_it(postgres_url):
    async def scenario() -> None:
        signals = PostgresSignals(postgres_params(postgres_url))
        await signals.start()
        try:
            assert signals.connected
            _behind_the_loops_back(
                postgres_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = $1 AND datname = current_database()", LISTENER_NAME)
            assert not signals.connected
            for _ in range(100):  # back, with a new generation
                if signals.connected and signals.generation == 2:
                    break
                await asyncio.sleep(0.05)
            assert signals.connected and signals.generation == 2
        finally:
            await signals.stop()

    asyncio.run(scenario())
