"""The process owner: `Process` builds a server process's parts and starts and stops
them in order, as Temporal's `Worker` owns its pollers.

The parts: the `Core` (the store, the caches and their invalidation, signals), the run
engine, the three loops (schedule fires `FireLoop`, webhook deliveries `DeliveryLoop`,
retention `RetentionTimer`) and the MCP host. The web app (`web/app.py`, which
`orchestra serve` runs) builds HTTP around one and calls it from Sanic's listeners; it
is the only owner of these parts in a process.

It has a layer of its own, just above the composition root and below the web layer
(tests/test_architecture.py): it imports the core, services and engine, never the web
layer. The MCP host is the web layer's (it serves HTTP), so the
owner is given the function that builds it from the Core.

Stopping is in two steps, because the HTTP server closes its connections between them:
`stop()` before (the loops, the MCP host, then the engine's grace and hand-back, so a
run is handed back while its readers' streams are still open), `close()` after (`stop()` if it has
not run yet, then the signals, the store's pool; the last spans flushed).
Each step goes on past a part that fails to stop: a loop's error never keeps the runs
from being handed back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from orchestra.core import Core
from orchestra.money.prices import load_prices
from orchestra.observability import tracing
from orchestra.services.deliveries import DeliveryLoop
from orchestra.services.retention import RetentionTimer
from orchestra.services.schedule_fires import FireLoop
from orchestra.services.uploads import sweep_stray_files
from orchestra.settings import Settings

logger = logging.getLogger("orchestra.process")


class Stoppable(Protocol):
    async def stop(self) -> None: ...


class Process:
    """A server process's parts, built from an open `Core` (`Process.open` opens one)."""

    def __init__(self, core: Core, *, mcp_host: Callable[[Core], Stoppable]) -> None:
        self.core = core
        self.engine = core.engine
        # Retention: ended runs past ORCHESTRA_RUN_RETENTION_DAYS and expired refresh
        # tokens, at start and hourly (services/retention.py).
        self.retention = RetentionTimer(core)
        # Schedules: this process fires due times with the others, each exactly once
        # (services/schedule_fires.py).
        self.fires = FireLoop(core)
        # Outbound events: this process delivers the outbox with the others, each
        # delivery by one process at a time (services/deliveries.py).
        self.deliveries = DeliveryLoop(core)
        # /mcp: its sessions live in this process, built on the first /mcp request.
        self.mcp = mcp_host(core)
        self._stopped = False

    @classmethod
    async def open(cls, settings: Settings, *, mcp_host: Callable[[Core], Stoppable]) -> Process:
        """Open the store (pending migrations applied) and build every part."""
        tracing.setup()  # when OTEL_EXPORTER_OTLP_ENDPOINT asks for traces (the `otel` extra)
        return cls(await Core.open(settings), mcp_host=mcp_host)

    async def start(self) -> None:
        """Start the parts, store first: the engine listens for signals, resumes runs left
        without a live owner and claims queued ones; then the loops. A part that fails
        to start stops those started before it."""
        try:
            files, folders = await asyncio.to_thread(sweep_stray_files, self.core.settings.uploads_dir)
            await asyncio.to_thread(load_prices)  # off the event loop, before any request
            if files or folders:
                logger.info("removed %d stray upload temp file(s) and %d empty folder(s)", files, folders)
            await self.engine.start()
            self.retention.start()
            self.fires.start()
            self.deliveries.start()
        except BaseException:
            await self.close()  # stops what started first
            raise

    async def stop(self) -> None:
        """Before the HTTP connections close: the loops stop (a fire or a delivery in
        flight finishes its transaction), the MCP host's sessions end, then the engine
        stops claiming, lets in-flight steps finish for the grace and hands every run
        still here back, so another process goes on at once. Once."""
        if self._stopped:
            return
        self._stopped = True
        for name, part in (("retention", self.retention), ("schedule fires", self.fires),
                           ("deliveries", self.deliveries), ("the MCP host", self.mcp),
                           ("the engine", self.engine)):
            try:
                await part.stop()
            except Exception:  # noqa: BLE001 - the parts after it must still stop
                logger.warning("stopping %s failed", name, exc_info=True)

    async def close(self) -> None:
        """After the HTTP server stopped: the store closes (signals, hashing pool, the
        store's pool), and the last spans (a handed-back run's) leave."""
        await self.stop()
        try:
            await self.core.close()
        finally:
            tracing.flush()
