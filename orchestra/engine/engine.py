"""The run engine's public face: `Engine` starts and stops, takes submitted runs, and
answers replies and cancels from any process.

`Engine` is composed of parts, one module each: `claims` (claim and lease loops),
`run_task` (a run's lifecycle), `scheduler` (DAG scheduling), `agent_step` (model
turns and tool calls), `questions` (human questions and replies). A run's own writes go
through its `RunWriter`, in order. The engine is given what it needs — an agent
resolver, the tool registry, a file reader, the signals — by the composition root
(`orchestra.core.Core.engine`); it imports nothing from services.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from orchestra.db.database import make_database
from orchestra.db.models import WorkflowRun
from orchestra.db.outage import StoreOutage
from orchestra.db.signals import Signals
from orchestra.engine.agent_step import AgentSteps
from orchestra.engine.claims import ClaimLoops
from orchestra.engine.containers import Containers
from orchestra.engine.feed import Feeds
from orchestra.engine.language.sandbox import Bounds, Sandbox
from orchestra.engine.live import LiveRun
from orchestra.engine.log import EventLog
from orchestra.engine.ownership import Ownership, process_identity
from orchestra.engine.questions import HumanQuestions
from orchestra.engine.provider_gate import ProviderGate
from orchestra.engine.run_task import RunLifecycle
from orchestra.engine.scheduler import Scheduler
from orchestra.engine.spend import Spending
from orchestra.engine.tools import ToolRegistry
from orchestra.engine.vocabulary import ACTIVE, RunStatus

logger = logging.getLogger("orchestra.engine")

CANCEL_WAIT_SECONDS = 5.0  # how long a cancel waits for another process's owner to end the run


class AgentResolver(Protocol):
    """What the engine asks for an agent step's configuration (services' AgentCache)."""

    async def worker(self, worker_id: str) -> Any: ...

    async def node(self, name: str) -> Any: ...


class Engine(ClaimLoops, RunLifecycle, Scheduler, Containers, AgentSteps, Spending, HumanQuestions):
    """Owns this process's run tasks, its claims and leases, and its live event feeds."""

    def __init__(
        self,
        core: Any,
        *,
        agents: AgentResolver,
        registry: ToolRegistry,
        read_upload: Callable[[str, str], Awaitable[str]],
        signals: Signals,
        exclusive: bool,
        token_interval: float = 0.05,
        retry_base_delay: float = 0.5,
    ) -> None:
        self.core = core
        self.db = core.db
        self.settings = core.settings
        self.agents = agents
        self.registry = registry
        self.read_upload = read_upload
        self.signals = signals
        self.exclusive = exclusive  # one process serves this store (SQLite)
        self.log = EventLog(core.db)
        self.log.fence_for = self._fence_of  # an owner's appends check its claim
        self.feeds = Feeds(self.log, signals)
        self.outage: StoreOutage = core.extras.setdefault("store_outage", StoreOutage())
        self.lease_db = core.db  # the lease loop's connection; its own one on PostgreSQL
        self.ownership = Ownership(
            core.db, me=process_identity(), lease_seconds=self.settings.run_lease_seconds
        )
        self.token_interval = token_interval
        self.retry_base_delay = retry_base_delay
        self.runs: dict[str, LiveRun] = {}
        # Bounded evaluation of user-supplied work (SPEC §15): runs' CEL and structured
        # answers in one pool, requests' schema checks (start, reply) in their own, so a
        # user's heavy runs never make another's request wait for a worker.
        self.sandbox = Sandbox(Bounds.from_settings(self.settings))
        self.request_sandbox = Sandbox(Bounds.from_settings(self.settings))
        self._clients: dict[tuple, Any] = {}
        self._clients_lock = asyncio.Lock()
        self.gate = ProviderGate(  # provider limits (SPEC §12), across processes on PostgreSQL
            core.db, shared=not exclusive, write_transaction=core.write_transaction,
            release=self.log.release, lease_seconds=max(120.0, self.settings.llm_timeout * 2))
        self._loops: list[asyncio.Task] = []
        self._wake: asyncio.Event | None = None
        self._started: asyncio.Future | None = None
        self.stopping = False

    def is_live(self, trace_id: str) -> bool:
        return trace_id in self.runs

    async def start(self) -> None:
        """Listen for signals and start claiming and renewing (once; later calls wait)."""
        if self._started is not None:
            return await asyncio.shield(self._started)
        self._started = asyncio.get_running_loop().create_future()
        try:
            self._wake = asyncio.Event()
            self.signals.on("control", self._control)
            self.signals.on_resync(self._resync)
            await self.signals.start()
            if not self.exclusive:  # renewals never queue behind request traffic
                self.lease_db = make_database(self.settings.database_url, pool_size=1)
            if self.exclusive:  # the last owner of any unfinished run is certainly gone
                await self.ownership.expire_all()
                await self.log.release()
            self._loops = [
                asyncio.get_running_loop().create_task(self._claim_loop(), name="run-claims"),
                asyncio.get_running_loop().create_task(self._lease_loop(), name="run-leases"),
            ]
            self._started.set_result(None)
        except BaseException as exc:
            self._started.set_exception(exc)
            raise

    @property
    def room(self) -> int:
        return 0 if self.stopping else self.settings.max_runs - len(self.runs)

    async def submit(self, trace_id: str) -> None:
        """A run was stored `queued`: take it here if there is room, else wake the others."""
        await self.start()
        if self.room > 0:
            run = await self._claim_to_run(trace_id)
            await self.log.release()
            if run is not None:
                self._launch(run)
                return
        await self.signals.notify("control", f"wake:{trace_id}")

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop claiming; let in-flight steps finish for `grace` seconds; hand every run
        still here back to the store (its lease ends now) so another process goes on."""
        self.stopping = True
        if self._wake is not None:  # the claim loop ends now, not after its next wait
            self._wake.set()
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        for live in self.runs.values():
            live.poke()
        tasks = [live.task for live in self.runs.values() if live.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        rest = [live for live in self.runs.values() if live.task is not None and not live.task.done()]
        for live in rest:
            self._stop_local(live, "handback", "")
        if rest:  # handing back is one statement each; bounded so SIGTERM exits in time
            await asyncio.wait([live.task for live in rest], timeout=2)
        # The loops end first: the lease loop's task keeps the lease connection (a pool of
        # one) for as long as it runs, and the bulk hand-back below needs it.
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        # Tasks that could not hand back in time (a busy store, writes still settling):
        # all at once here, on the lease connection, rather than leaving them to their
        # leases — a run found with a lapsed lease is counted as a crash.
        late = [live.claim for live in rest if not live.task.done() and live.claim]
        if late:
            try:
                await self.ownership.hand_back_many(late, db=self.lease_db)
            except Exception:  # noqa: BLE001 - then their leases run out, as after a crash
                logger.warning("could not hand back %d run(s) at shutdown", len(late))
        if self._started is not None and self._started.done() and not self._started.exception():
            try:
                await self.signals.notify("control", "wake:")
            except Exception:  # noqa: BLE001 - others find the runs on their next scan
                pass
        for client in self._clients.values():
            try:
                await client.aclose()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._clients.clear()
        if self.lease_db is not self.db:
            try:
                await self.lease_db.close_pool()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        await self.sandbox.close()
        await self.request_sandbox.close()

    async def cancel(self, trace_id: str, *, reason: str = "The run was cancelled by request.") -> None:
        """Cancel an unfinished run wherever it executes, and wait (a little) for its end."""
        await self.db.aexecute(
            WorkflowRun.update(cancel_requested=True).where(
                (WorkflowRun.trace_id == trace_id) & WorkflowRun.status.in_(list(ACTIVE))
            )
        )
        live = self.runs.get(trace_id)
        if live is None and not self.stopping:
            run = await self.ownership.claim(trace_id)  # nobody holds it: end it here
            if run is not None:
                live = self._launch(run)  # it sees cancel_requested and ends at once
        await self.log.release()
        if live is not None:
            self._stop_local(live, RunStatus.CANCELLED, reason)
            await asyncio.wait({live.task}, timeout=CANCEL_WAIT_SECONDS * 2)
            return
        await self.signals.notify("control", f"cancel:{trace_id}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT_SECONDS
        while loop.time() < deadline:
            last = await self.log.last_event(trace_id)
            await self.log.release()
            if last is None or last.terminal:
                return
            await asyncio.sleep(0.05)

    async def cancel_owner(self, user_id: str, *, reason: str) -> None:
        """Stop every live run of a user (the user is being deleted), all at once."""
        lives = [r for r in self.runs.values() if r.owner_id == user_id and r.task is not None]
        await self.log.release()
        for live in lives:
            self._stop_local(live, RunStatus.CANCELLED, reason)
        if lives:
            await asyncio.wait([live.task for live in lives], timeout=10)
