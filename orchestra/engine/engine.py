"""The run engine's public face: `Engine` starts and stops, takes submitted runs, and
answers replies and cancels from any process.

The engine builds the parts it owns and gives each what it needs (see
docs/architecture.md): the run store (`store/`: every statement about runs), the live
runs (`live.py`), the claim and lease loops (`claims.py`), a run's task
(`run_task.py`), the scheduler (`scheduler.py`) with one runner per step kind — calls
(`calls.py`, the model in `agent_step.py`), foreach and loop (`containers.py`) — the
instances' rows and events (`records.py`) and human questions (`questions.py`). The
engine is given what it needs from outside (an agent resolver, the tool registry, a
file reader, the signals) by the composition root; it imports nothing from services.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from orchestra.db.models import WorkflowRun
from orchestra.db.outage import StoreOutage
from orchestra.db.signals import Signals
from orchestra.engine.agent_step import AgentResolver, AgentSteps
from orchestra.engine.calls import Calls
from orchestra.engine.child_step import ChildSteps
from orchestra.engine.claims import Claims
from orchestra.engine.code_step import CodeSteps
from orchestra.engine.containers import Containers
from orchestra.engine.feed import Feeds, Follow
from orchestra.engine.http_step import HttpSteps
from orchestra.engine.live import CANCELLED_BY_REQUEST, LiveRuns
from orchestra.engine.model import Question, StepKind, StopReason
from orchestra.engine.provider_gate import ProviderGate
from orchestra.engine.questions import Questions
from orchestra.engine.records import Records
from orchestra.engine.reuse import ForkReuse
from orchestra.engine.run_task import RunTasks
from orchestra.engine.scheduler import Scheduler
from orchestra.engine.spend import Spending
from orchestra.engine.store import PostgresRunStore, RunStore, make_run_store
from orchestra.engine.store.events import Outbox
from orchestra.engine.store.runs import Asked
from orchestra.engine.store.secrets import SecretReader
from orchestra.engine.tools.base import ToolRegistry
from orchestra.language.sandbox import Bounds, Sandbox
from orchestra.settings import Settings

logger = logging.getLogger("orchestra.engine")

CANCEL_WAIT_SECONDS = 5.0  # how long a cancel waits for another process's owner to end the run
CANCEL_SIGNAL_IDS = 100  # trace ids a `cancel:` signal names at most (a NOTIFY's payload < 8,000 bytes)

__all__ = ["AgentResolver", "Engine"]


class Engine:
    """Owns this process's run tasks, its claims and leases, and its live event feeds."""

    def __init__(
        self,
        *,
        db: Any,
        settings: Settings,
        outage: StoreOutage,
        agents: AgentResolver,
        registry: ToolRegistry,
        read_upload: Callable[[str, str], Awaitable[str]],
        signals: Signals,
        decrypt: Callable[[str], str] | None = None,
        outbox: Outbox | None = None,
        token_interval: float = 0.05,
        retry_base_delay: float = 0.5,
    ) -> None:
        self.settings = settings
        self.signals = signals
        self.store: RunStore = make_run_store(db, url=settings.database_url,
                                              lease_seconds=settings.run_lease_seconds, outbox=outbox)
        self.feeds = Feeds(self.store.events, signals)
        self.runs = LiveRuns(settings.max_runs, settings.max_runs_per_user)
        # Bounded evaluation of user-supplied work (SPEC §15): runs' CEL and structured
        # answers in one pool, requests' schema checks (start, reply) in their own, so a
        # user's heavy runs never make another's request wait for a worker.
        self.sandbox = Sandbox(Bounds.from_settings(settings))
        self.request_sandbox = Sandbox(Bounds.from_settings(settings))
        records = Records(self.store, output_max_bytes=settings.step_output_max_bytes)
        self.questions = Questions(self.store, self.runs, signals, self.request_sandbox)
        # Money (SPEC §12): provider limits across processes, budgets reserved per call.
        self.gate = ProviderGate(
            self.store.db, shared=isinstance(self.store, PostgresRunStore),
            write_transaction=self.store.write_transaction, release=self.store.release,
            lease_seconds=max(120.0, settings.llm_timeout * 2))
        spending = Spending(store=self.store, records=records, gate=self.gate,
                            max_tokens=settings.llm_max_tokens)
        self.agent_steps = AgentSteps(
            settings, store=self.store, records=records, questions=self.questions,
            agents=agents, registry=registry, read_upload=read_upload, sandbox=self.sandbox,
            spending=spending, token_interval=token_interval, retry_base_delay=retry_base_delay,
        )
        # HTTP steps and child workflows (SPEC §14); `decrypt` opens the secrets they name
        self.http_steps = HttpSteps(settings, secrets=SecretReader(db), decrypt=decrypt)
        # A child run starts through the engine's own claim rule (`claim_now`, `begin`).
        self.child_steps = ChildSteps(store=self.store, records=records, feeds=self.feeds,
                                      sandbox=self.sandbox, stopping=lambda: self.runs.stopping,
                                      claim_now=self.claim_now, begin=self.begin,
                                      cancel_below=self.cancel_below,
                                      tree_max_active=settings.child_tree_max_active)
        self.code_steps = CodeSteps(settings, store=self.store, sandbox=self.sandbox)  # SPEC §17: its worker pool
        calls = Calls(store=self.store, records=records, agents=self.agent_steps, spending=spending,
                      questions=self.questions, prompt_max_bytes=settings.prompt_max_bytes,
                      http=self.http_steps, children=self.child_steps, code=self.code_steps,
                      reuse=ForkReuse(self.store, records))
        scheduler = Scheduler(store=self.store, runs=self.runs, records=records, sandbox=self.sandbox)
        containers = Containers(runs=self.runs, records=records, scheduler=scheduler, calls=calls,
                                sandbox=self.sandbox, foreach_max_items=settings.foreach_max_items)
        # The step kinds and their runners: a new kind of step registers here.
        scheduler.register(StepKind.CALL, calls.step)
        scheduler.register(StepKind.FOREACH, containers.foreach)
        scheduler.register(StepKind.LOOP, containers.loop)
        self.tasks = RunTasks(settings, store=self.store, runs=self.runs, scheduler=scheduler,
                              sandbox=self.sandbox, outage=outage,
                              on_unhappy_end=self.child_steps.cancel_descendants_soon)
        self.claims = Claims(settings, store=self.store, runs=self.runs, tasks=self.tasks,
                             questions=self.questions, outage=outage)
        self._started: asyncio.Future | None = None
        self._stopped: asyncio.Future | None = None

    @property
    def stopping(self) -> bool:
        return self.runs.stopping

    # -- reading ----------------------------------------------------------------------------
    def is_live(self, trace_id: str) -> bool:
        """The run executes in this process now."""
        return trace_id in self.runs

    def follow(self, trace_id: str, *, after: int = 0, ping_every: float = 15.0) -> Follow:
        """A run's events after `after`, stored ones then live ones (an SSE stream)."""
        return self.feeds.follow(trace_id, after=after, ping_every=ping_every)

    async def open_questions(self, trace_id: str) -> list[dict[str, str]]:
        """`[{request_id, step_id, prompt}]` the run waits on, oldest first."""
        return await self.questions.open_questions(trace_id)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen for signals and start claiming and renewing (once; later calls wait).
        The first start waits for the signal channel (PostgreSQL's LISTEN connection):
        the caller's store connection goes back to the pool first."""
        if self._started is not None and self._started.done():
            return self._started.result()
        await self.store.release()
        if self._started is not None:
            return await asyncio.shield(self._started)
        self._started = asyncio.get_running_loop().create_future()
        try:
            self.signals.on("control", self.claims.on_control)
            self.signals.on_resync(self.claims.on_resync)
            await self.signals.start()
            await self.store.start()
            self.claims.start()
            self._started.set_result(None)
        except BaseException as exc:
            self._started.set_exception(exc)
            raise

    def workspace_limits_changed(self) -> None:
        """A workspace's limits changed somewhere (the `cache` hint for `workspace`):
        whether its calls reserve under a monthly budget is read again (SPEC §16)."""
        self.store.ledger.months.invalidate()

    def wake(self) -> None:
        """Look for runs to claim now (as a `wake` signal would)."""
        self.runs.wake()

    async def submit(self, trace_id: str) -> None:
        """A run was stored `queued`: take it here if there is room, else wake the others."""
        await self.submit_many([trace_id])

    async def submit_many(self, trace_ids: list[str]) -> None:
        """Runs were stored `queued` (a burst: a minute's schedule fires): take as many as
        there is room for, claimed and started together (`Claims.take`), and wake the
        other processes for the rest."""
        await self.start()
        try:
            taken = set(await self.claims.take(trace_ids))
        finally:
            await self.store.release()
        rest = [trace_id for trace_id in trace_ids if trace_id not in taken]
        if rest:
            await self.signals.notify("control", f"wake:{rest[0]}")

    def claim_now(self, owner_id: str) -> dict[str, Any]:
        """The columns of a run of `owner_id` this process stores claimed, to execute it at
        once with no claim round (`adopt` once stored), or {} when it has no room for it
        (or is not started): then the run is stored queued and `submit`ted."""
        started = self._started is not None and self._started.done() and not self._started.exception()
        if not started or self.runs.room_for(owner_id) <= 0:
            return {}
        return self.store.ownership.claimed_columns()

    async def begin(self, run: WorkflowRun) -> None:
        """A run just created (`RunStore.create` with `claim_now`) starts: here at once
        when it was stored claimed, else submitted."""
        if run.owner_process:  # a retry's or a fork's reused steps are read when it begins
            await self.adopt(run, fresh=run.retry_of is None and run.forked_from is None)
        else:
            await self.submit(run.trace_id)

    async def adopt(self, run: WorkflowRun, *, fresh: bool = True) -> None:
        """Execute a run stored claimed by this process (`claim_now`); when the room
        went meanwhile (or the process began stopping), give it back for any process.
        `fresh`: it has no step rows but pending ones (LiveRun.fresh)."""
        if self.runs.room_for(run.owner_id) > 0:
            self.claims.launch(run, fresh=fresh)
            return
        try:
            await self.store.hand_back(run.trace_id, run.owner_process)
            await self.store.release()
            await self.signals.notify("control", f"wake:{run.trace_id}")
        except Exception:  # noqa: BLE001 - then its lease runs out and any process claims it
            logger.warning("could not give back run %s", run.trace_id, exc_info=True)

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop claiming; let in-flight steps finish for `grace` seconds; hand every run
        still here back to the store (its lease ends now) so another process goes on.
        Once: a later call (the Core closing after the server stopped) waits for the first."""
        if self._stopped is not None:
            return await asyncio.shield(self._stopped)
        self._stopped = asyncio.get_running_loop().create_future()
        try:
            await self._stop(grace)
        finally:
            self._stopped.set_result(None)

    async def _stop(self, grace: float | None) -> None:
        self.runs.begin_stopping()
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        tasks = [live.task for live in self.runs if live.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        rest = self.runs.running()
        for live in rest:
            self.runs.stop(live, StopReason.HANDBACK)
        if rest:  # handing back is one statement each; bounded so SIGTERM exits in time
            await asyncio.wait([live.task for live in rest], timeout=2)
        # The loops end first: the lease loop's task keeps the lease connection (a pool of
        # one) for as long as it runs, and the bulk hand-back below needs it.
        await self.claims.stop()
        # Tasks that could not hand back in time (a busy store, writes still settling):
        # all at once here, on the lease connection, rather than leaving them to their
        # leases — a run found with a lapsed lease is counted as a crash.
        late = [live.claim for live in rest if not live.task.done() and live.claim]
        if late:
            try:
                await self.store.hand_back_many(late)
            except Exception:  # noqa: BLE001 - then their leases run out, as after a crash
                logger.warning("could not hand back %d run(s) at shutdown", len(late))
        if self._started is not None and self._started.done() and not self._started.exception():
            with contextlib.suppress(Exception):  # others find the runs on their next scan
                await self.signals.notify("control", "wake:")
        await self.agent_steps.close()
        await self.http_steps.close()
        await self.child_steps.close()
        await self.code_steps.close()
        await self.gate.close()
        await self.store.stop()
        await self.sandbox.close()
        await self.request_sandbox.close()

    # -- commands from any process ----------------------------------------------------------
    async def cancel(self, trace_id: str, *, reason: str = CANCELLED_BY_REQUEST,
                     audit: Callable[[], Awaitable[None]] | None = None) -> None:
        """Cancel an unfinished run and every unfinished run below it (its child runs,
        SPEC §14) wherever they execute, and wait (a little) for their ends. The whole
        tree is marked in one transaction (`RunStore.request_cancel`), `audit` written in
        it (SPEC §16); then it is stopped at once (`_stop_asked`). The runs below it end
        with "Its parent run … was cancelled."."""
        asked = await self.store.request_cancel(trace_id, also=audit)
        await self._stop_asked(asked, reason, top=trace_id)

    async def cancel_below(self, trace_id: str, reason: str, *, itself: bool = False) -> None:
        """Cancel the unfinished runs below `trace_id` (and it, `itself`) whose cancel
        nobody asked yet: a run ended other than succeeded, a step ended without its child
        (SPEC §14). After a cancel of the whole tree it finds none: one read, nothing
        written, nobody told."""
        asked = await self.store.request_cancel(trace_id, itself=itself, again=False)
        await self._stop_asked(asked, reason)

    async def _stop_asked(self, asked: list[Asked], reason: str, *, top: str | None = None) -> None:
        """Runs just marked to be cancelled, stopped at once, none awaited before the
        next: those live here stopped, those nobody holds claimed (one statement) and
        ended here, the other processes told in a few signals (`cancel:<id>,<id>…`; their
        lease ticks would see the mark too); then a wait, bounded, for their ends. `top`:
        the run cancelled by request; those below it end naming it."""
        await self.store.release()
        if not asked:
            return
        lives, rest = [], []
        for run in asked:
            live = self.runs.get(run.trace_id)
            (lives if live is not None else rest).append(live or run.trace_id)
        below = f"Its parent run {top} was cancelled." if top else reason

        def why(trace_id: str) -> str:
            return below if top and trace_id != top else reason

        for live in lives:
            live.tree_cancelled = True
            self.runs.stop(live, StopReason.CANCELLED, why(live.trace_id))
        if rest and not self.runs.stopping:
            claimed = await self.claims.claim_many(rest)  # nobody holds them: they end here
            lives += [self.claims.launch(run, cancel_message=why(run.trace_id)) for run in claimed]  # at once
            taken = {run.trace_id for run in claimed}
            rest = [trace_id for trace_id in rest if trace_id not in taken]
        await self.store.release()
        for at in range(0, len(rest), CANCEL_SIGNAL_IDS):
            await self.signals.notify("control", "cancel:" + ",".join(rest[at:at + CANCEL_SIGNAL_IDS]))
        if lives:
            await asyncio.wait({live.task for live in lives}, timeout=CANCEL_WAIT_SECONDS * 2)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT_SECONDS
        while rest and loop.time() < deadline:  # ended elsewhere: one read a round for all
            rest = await self.store.unfinished(rest)
            await self.store.release()
            if rest:
                await asyncio.sleep(0.05)

    async def cancel_owner(self, user_id: str, *, reason: str) -> None:
        """Stop every live run of a user (the user is being deleted), all at once."""
        lives = [live for live in self.runs if live.owner_id == user_id and live.task is not None]
        await self.store.release()
        for live in lives:
            self.runs.stop(live, StopReason.CANCELLED, reason)
        if lives:
            await asyncio.wait([live.task for live in lives], timeout=10)

    async def reply(self, trace_id: str, *, content: Any, request_id: str | None,
                    audit: Callable[[Question], Awaitable[None]] | None = None) -> Question:
        """Store the answer to an open question of the run and deliver it to its owner;
        `audit(question)` is written in the answer's transaction (SPEC §16)."""
        return await self.questions.reply(trace_id, content=content, request_id=request_id, audit=audit)
