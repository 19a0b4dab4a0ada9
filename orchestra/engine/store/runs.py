"""The run store: every statement the engine sends about runs, in one place.

Claims and leases (`ownership.py`), the event log (`events.py`) and, here, fencing and
the rows of runs and step instances. A run owner's write is *fenced*: it runs in one
transaction with a check that the owner's claim still holds (`fence`), so a process
that lost the run is refused by the store. `write` is the one place where row changes
and run events are stored together, in one transaction, retried as a whole when
another writer took the same event seq (`SeqRetry`), and published after the commit.

`RunStore` speaks SQLite; `PostgresRunStore` (`postgres.py`) overrides what differs:
the write transaction, row locks, and a lease connection of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from peewee import Case, IntegrityError, fn

from orchestra.db.models import RunEvent, RunStep, WorkflowRun, utcnow
from orchestra.engine.model import At, Question
from orchestra.engine.store.creation import NewRun, create_runs
from orchestra.engine.store.events import (
    Event,
    EventLog,
    Fenced,
    Item,
    Outbox,
    RunGone,
    SeqRetry,
)
from orchestra.engine.store.ledger import NO_CHANGE, Change, Ledger
from orchestra.engine.store.ownership import Ownership, process_identity
from orchestra.vocabulary import ACTIVE, EventKind, RunStatus, StepStatus

#: One instance's change in a group write: (path, step id to create its row or None to
#: update it, column values, events to append after it).
InstanceChange = tuple[str, "str | None", dict[str, Any], list[Item]]

#: A run not yet ended: active, or waiting for a top-up (nobody holds it).
UNFINISHED = [*ACTIVE, RunStatus.WAITING_BUDGET]


@dataclass(frozen=True)
class Asked:
    """A run of a tree being cancelled (`RunStore.request_cancel`): who holds it (its
    claim's token, or None), and whether its cancel was asked before."""

    trace_id: str
    owner_process: str | None
    already: bool


class RunStore:
    """Runs in the store, as this process's engine reads and writes them (SQLite)."""

    def __init__(self, db: Any, *, lease_seconds: float, outbox: Outbox | None = None) -> None:
        self.db = db
        # An owner's appends check its claim; the outbox queues deliveries with their events.
        self.events = EventLog(db, fence_for=self._fence_of, outbox=outbox)
        # Renewals lock rows in the ledger's order (`locked`: the dialect's, below).
        self.ownership = Ownership(db, me=process_identity(), lease_seconds=lease_seconds,
                                   locked=self.locked)
        self.lease_db = db  # the lease loop's connection (PostgreSQL: one of its own)
        self._held: dict[str, str] = {}  # runs executing here: trace_id → claim token
        self.ledger = Ledger(self)  # what runs spend (SPEC §12): stored and unstored changes

    # -- the dialect's part ------------------------------------------------------------
    def write_transaction(self):
        """A transaction that reads, then writes. SQLite takes the write lock at BEGIN
        (IMMEDIATE): a deferred one that read first would fail with "database is locked"
        when a concurrent writer got in between, instead of waiting its turn."""
        return self.db.atomic(lock_type="IMMEDIATE")

    def locked(self, query):
        """`query` locking the rows it reads until the transaction ends (SQLite's write
        transaction already excludes every other writer)."""
        return query

    async def start(self) -> None:
        """One process serves a SQLite store: the last owner of any unfinished run is
        certainly gone, so every such run is claimable now."""
        await self.ownership.expire_all()
        await self.release()

    async def stop(self) -> None:
        """Close what `start` opened (nothing on SQLite)."""

    # -- new runs ------------------------------------------------------------------------
    async def create(self, runs: list[NewRun], *,
                     claim: Callable[[str], dict[str, Any]] | None = None) -> list[WorkflowRun]:
        """Store new runs, queued (or claimed: `claim`), in the caller's transaction: the
        one way runs are created (store/creation.py)."""
        return await create_runs(self.db, runs, claim=claim)

    # -- claims and leases ----------------------------------------------------------------
    @property
    def me(self) -> str:
        return self.ownership.me

    async def candidates(self, limit: int, *, per_user: int = 0,
                         busy: dict[str, int] | None = None) -> list[tuple[str, str]]:
        return await self.ownership.candidates(limit, per_user=per_user, busy=busy)

    async def owners(self, trace_ids: list[str]) -> dict[str, str]:
        return await self.ownership.owners(trace_ids)

    async def claim(self, trace_id: str, *, attempt: bool = True) -> WorkflowRun | None:
        return await self.ownership.claim(trace_id, attempt=attempt)

    async def claim_many(self, trace_ids: list[str], *, attempt: bool = True) -> list[WorkflowRun]:
        return await self.ownership.claim_many(trace_ids, attempt=attempt)

    async def renew(self, claims: dict[str, str]) -> dict[str, bool]:
        """Renew leases on the lease connection (never behind request traffic)."""
        return await self.ownership.renew(claims, db=self.lease_db)

    async def hand_back(self, trace_id: str, token: str) -> bool:
        return await self.ownership.hand_back(trace_id, token)

    async def hand_back_many(self, tokens: list[str]) -> int:
        return await self.ownership.hand_back_many(tokens, db=self.lease_db)

    async def request_cancel(self, trace_id: str, *, also: Callable[[], Awaitable[None]] | None = None,
                             itself: bool = True, again: bool = True) -> list[Asked]:
        """Mark an unfinished run and every unfinished run below it (its tree of child
        runs, SPEC §14) to be cancelled, in one transaction of two statements whatever the
        tree's size (`cancel_tree`, then one UPDATE): their owners see it on their next
        lease tick; one waiting for budget, which nobody holds, is queued to be ended. The
        runs found, top down. `also`: written in the same transaction when the run itself
        was marked (the request's audit entry, SPEC §16). `itself=False`: only the runs
        below it (a run that ended). `again=False`: only runs whose cancel nobody asked
        yet are marked and returned, and nothing is written when there are none (a middle
        run's end, after its whole tree was marked: one read)."""
        if not again:
            found = [run for run in await self.cancel_tree(trace_id, itself=itself) if not run.already]
            if not found:
                return []
        async with self.write_transaction():
            if again:
                found = await self.cancel_tree(trace_id, itself=itself)
            if found:
                waiting = WorkflowRun.status == RunStatus.WAITING_BUDGET
                await self.db.aexecute(WorkflowRun.update(
                    cancel_requested=True, status=Case(None, [(waiting, RunStatus.QUEUED)], WorkflowRun.status),
                ).where(self.ownership.in_lock_order(
                    WorkflowRun.trace_id.in_([run.trace_id for run in found]) & WorkflowRun.status.in_(UNFINISHED))))
            if also is not None and any(run.trace_id == trace_id for run in found):
                await also()
        return found

    async def cancel_tree(self, trace_id: str, *, itself: bool = True) -> list[Asked]:
        """The unfinished runs of the tree below `trace_id` (and it, `itself`, when it is
        unfinished), top down, in one statement (a recursive CTE; it walks down through
        unfinished runs only: a run that ended had its children cancelled then)."""
        below = WorkflowRun.alias("below")
        base = (WorkflowRun.select(WorkflowRun.trace_id).where(WorkflowRun.trace_id == trace_id)
                .cte("tree", recursive=True, columns=("trace_id",)))
        step = (below.select(below.trace_id).join(base, on=below.parent_trace_id == base.c.trace_id)
                .where(below.status.in_(UNFINISHED)))
        tree = base.union_all(step)
        where = WorkflowRun.status.in_(UNFINISHED)
        if not itself:
            where &= WorkflowRun.trace_id != trace_id
        rows = await self.db.list(
            WorkflowRun.select(WorkflowRun.trace_id, WorkflowRun.owner_process, WorkflowRun.cancel_requested)
            .join(tree, on=WorkflowRun.trace_id == tree.c.trace_id).where(where).with_cte(tree)
            .order_by(WorkflowRun.depth, WorkflowRun.trace_id).tuples())
        return [Asked(run, owner, bool(already)) for run, owner, already in rows]

    async def unfinished(self, trace_ids: list[str]) -> list[str]:
        """Those of these runs not ended yet, in one read."""
        rows = await self.db.list(WorkflowRun.select(WorkflowRun.trace_id).where(
            WorkflowRun.trace_id.in_(trace_ids) & WorkflowRun.status.in_(UNFINISHED)).tuples())
        return [trace_id for (trace_id,) in rows]

    # -- fencing --------------------------------------------------------------------------
    def hold(self, trace_id: str, token: str) -> None:
        """The run executes here under claim `token`: fence its writes on it from now on."""
        self._held[trace_id] = token

    def let_go(self, trace_id: str) -> None:
        """The run's task here has ended: no more fenced writes, no cached seq."""
        self._held.pop(trace_id, None)
        self.ledger.forget(trace_id)
        self.events.forget(trace_id)

    async def fence(self, trace_id: str, *, spent: Change = NO_CHANGE) -> None:
        """Inside a transaction, for a run executing here: lock its row while this
        process's claim holds it, else raise Fenced (nothing of the transaction is
        written, and the run's task stops). Other runs: nothing to check. `spent`: a
        change to the run's ledger, stored by the same statement (and rolled up to the
        runs above it and to its workspace's months, store/ledger.py)."""
        token = self._held.get(trace_id)
        if not token:
            await self.ledger.add(trace_id, spent.pico, spent.months)
            return
        values: dict[str, Any] = {"owner_process": WorkflowRun.owner_process}
        if spent.pico:
            values["spent_pusd"] = fn.COALESCE(WorkflowRun.spent_pusd, 0) + spent.pico
        changed = await self.db.aexecute(
            WorkflowRun.update(**values).where(self.ownership.holds(trace_id, token)))
        if not changed:
            raise Fenced(f"run {trace_id}: this process no longer holds its claim")
        await self.ledger.add_above(trace_id, spent.pico, spent.months)

    def held(self, trace_id: str) -> str:
        """The claim token this process executes the run under ("" if none)."""
        return self._held.get(trace_id, "")

    def _fence_of(self, trace_id: str) -> Callable[[], Awaitable[None]] | None:
        """For the event log: the fence of an append to a run executing here, or None."""
        if not self._held.get(trace_id):
            return None
        return lambda: self.fence(trace_id)

    async def _fenced(self, trace_id: str, query) -> None:
        """Execute an owner's row change in one transaction with the fence (or inside the
        caller's, which checked it already)."""
        if self.db.in_transaction() or trace_id not in self._held:
            await self.db.aexecute(query)
            return
        async with self.write_transaction():
            await self.fence(trace_id)
            await self.db.aexecute(query)

    # -- rows -----------------------------------------------------------------------------
    async def set_run(self, trace_id: str, **values: Any) -> None:
        await self._fenced(trace_id, WorkflowRun.update(**values).where(WorkflowRun.trace_id == trace_id))

    async def set_step(self, trace_id: str, path: str, **values: Any) -> None:
        """Update one instance's row (`path`: a top-level step's is its id)."""
        await self._fenced(trace_id, RunStep.update(**values).where(
            (RunStep.run == trace_id) & (RunStep.path == path)))

    async def put_instance(self, trace_id: str, path: str, step_id: str, **values: Any) -> None:
        """Create an instance's row, or update it when it exists (a top-level step's row
        is made with the run; an item's or an iteration's when it first starts)."""
        await self._fenced(trace_id, RunStep.insert(run=trace_id, path=path, step_id=step_id, **values)
                           .on_conflict(conflict_target=[RunStep.run, RunStep.path], update=values))

    async def step_rows(self, trace_id: str) -> list[RunStep]:
        return await self.db.list(RunStep.select().where(RunStep.run == trace_id))

    async def run_row(self, trace_id: str, *, lock: bool = False) -> WorkflowRun | None:
        query = WorkflowRun.select().where(WorkflowRun.trace_id == trace_id)
        rows = await self.db.list(self.locked(query) if lock else query)
        return rows[0] if rows else None

    # -- rows with events, in one transaction ---------------------------------------------
    async def write(self, trace_id: str, store: Callable[[], Awaitable[list[Event]]], *,
                    fenced: bool = True) -> list[Event]:
        """Run `store()` — row changes and `events.insert` — in one write transaction,
        from the start again while another writer takes the same seq (a conflict aborts a
        PostgreSQL transaction, so only a whole retry works); publish after the commit.
        `fenced=False`: a write any process may make (a reply)."""
        retry: SeqRetry | None = None
        while True:
            spent = self.ledger.take(trace_id) if fenced else NO_CHANGE
            try:
                async with self.write_transaction():
                    if fenced:  # an owner's write: its claim still holds, or Fenced
                        await self.fence(trace_id, spent=spent)
                    events = await store()
                self.ledger.landed(trace_id, spent)
                break
            except BaseException as exc:
                self.ledger.keep(trace_id, spent, known_failed=isinstance(exc, IntegrityError))
                if not isinstance(exc, IntegrityError):
                    raise
                # a seq taken meanwhile, or the run deleted
                self.events.forget(trace_id)  # read the last seq from the store next time
                if await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id) is None:
                    raise RunGone(f"run {trace_id} no longer exists") from None
                retry = retry or SeqRetry(self.db)
                await retry.again(trace_id)
        self.events.remember(trace_id, events)
        self.events.published(trace_id, events)
        return events

    # -- spend (SPEC §12; the ledger is store/ledger.py) -----------------------------------
    async def pause_for_budget(self, trace_id: str, data: dict[str, Any], *,
                               spends: dict[str, dict[str, Any]] | None = None) -> None:
        """The run waits for a top-up: `waiting_budget`, held by nobody, with its
        `budget_exhausted` event, in one fenced write. Its unfinished instances' costs so
        far (`spends`, by path) are stored on their rows, and those that were running
        are `pending` again (nothing runs them until the run goes on); the event names
        them (`paused_steps`)."""

        async def store() -> list[Event]:
            await self.set_run(trace_id, status=RunStatus.WAITING_BUDGET,
                               owner_process=None, lease_until=None)
            await self._store_spends(trace_id, spends)
            running = RunStep.status == StepStatus.RUNNING
            paused = [path for (path,) in await self.db.list(RunStep.select(RunStep.path).where(
                (RunStep.run == trace_id) & running).order_by(RunStep.path).tuples())]
            if paused:
                await self.db.aexecute(RunStep.update(status=StepStatus.PENDING).where(
                    (RunStep.run == trace_id) & running))
            return await self.events.insert(trace_id, [(EventKind.BUDGET_EXHAUSTED,
                                                        {**data, "paused_steps": paused}, None)])

        await self.write(trace_id, store)

    async def _store_spends(self, trace_id: str, spends: dict[str, dict[str, Any]] | None) -> None:
        for path, fields in (spends or {}).items():
            await self.db.aexecute(RunStep.update(**fields).where(
                (RunStep.run == trace_id) & (RunStep.path == path)))

    async def store_instances(self, changes: list[InstanceChange], trace_id: str) -> None:
        """Instances' row changes (a row created when a step id is given, else updated)
        and their events, in order, in one transaction: one store round for a step's
        start or end, or for all the starts and ends that queued up together."""

        async def store() -> list[Event]:
            events: list[Item] = []
            for path, step_id, values, step_events in changes:
                if step_id is None:
                    await self.set_step(trace_id, path, **values)
                else:
                    await self.put_instance(trace_id, path, step_id, **values)
                events += step_events
            return await self.events.insert(trace_id, events)

        await self.write(trace_id, store)

    async def store_run(self, trace_id: str, values: dict[str, Any], items: list[Item]) -> None:
        """The run's row change with its events (`run_started`, `run_resumed`), at once."""

        async def store() -> list[Event]:
            await self.set_run(trace_id, **values)
            return await self.events.insert(trace_id, items)

        await self.write(trace_id, store)

    async def store_asked(self, trace_id: str, path: str, items: list[Item]) -> None:
        """The run and the step `waiting_reply`, with the question's events, at once."""

        async def store() -> list[Event]:
            await self.set_run(trace_id, status=RunStatus.WAITING_REPLY)
            await self.set_step(trace_id, path, status=StepStatus.WAITING_REPLY)
            return await self.events.insert(trace_id, items) if items else []

        await self.write(trace_id, store)

    async def end(self, trace_id: str, kind: str, data: dict[str, Any], *, status: str,
                  error: str | None = None, spends: dict[str, dict[str, Any]] | None = None) -> None:
        """Store a run's terminal event together with its final rows, in one transaction,
        and only then publish it: whoever sees the event reads the final state.
        `spends`: the cost so far of instances left unfinished, by path."""
        now = utcnow()
        step_status = StepStatus.CANCELLED if status == RunStatus.FAILED else status

        async def store() -> list[Event]:
            await self._store_spends(trace_id, spends)
            if status != RunStatus.SUCCEEDED:
                paused = (RunStep.status == StepStatus.PENDING) & RunStep.started_at.is_null(False)
                await self.db.aexecute(  # paused for budget (pending again, once started) included
                    RunStep.update(status=step_status, finished_at=now).where(
                        (RunStep.run == trace_id)
                        & (RunStep.status.in_([StepStatus.RUNNING, StepStatus.WAITING_REPLY]) | paused)
                    )
                )
                await self.db.aexecute(
                    RunStep.update(status=StepStatus.SKIPPED).where(
                        (RunStep.run == trace_id) & (RunStep.status == StepStatus.PENDING)
                    )
                )
            await self.set_run(trace_id, status=status, error=error, finished_at=now,
                               owner_process=None, lease_until=None)
            return await self.events.insert(trace_id, [(kind, data, None)])

        await self.write(trace_id, store)

    async def start_many(self, starts: dict[str, dict[str, Any]]) -> list[str]:
        """`run_started` (`starts`: {trace_id: its data}) for runs claimed here together,
        with their rows `running`, in one transaction of four statements: a burst of
        queued runs starts without a transaction per run. Only fresh runs start here —
        no event stored and no reused step (a retry's or a fork's steps are written by
        its own task) — and only while this process's claims hold (else Fenced, and
        nothing is written). The trace ids started, after their events are published."""
        ids = [trace_id for trace_id in starts if self._held.get(trace_id)]
        if not ids:
            return []
        now = utcnow()
        async with self.write_transaction():
            begun = {run for (run,) in await self.db.list(
                RunEvent.select(RunEvent.run).where(RunEvent.run.in_(ids)).distinct().tuples())}
            begun |= {run for (run,) in await self.db.list(
                RunStep.select(RunStep.run).where(RunStep.run.in_(ids) & (RunStep.reused == True))  # noqa: E712
                .distinct().tuples())}
            ids = [trace_id for trace_id in ids if trace_id not in begun]
            if not ids:
                return []
            changed = await self.db.aexecute(
                WorkflowRun.update(status=RunStatus.RUNNING, started_at=now).where(
                    WorkflowRun.trace_id.in_(ids)
                    & WorkflowRun.owner_process.in_([self._held[trace_id] for trace_id in ids])))
            if changed != len(ids):
                raise Fenced(f"{len(ids) - changed} of {len(ids)} runs are no longer held here")
            stored = await self.events.insert_first(
                {trace_id: [(EventKind.RUN_STARTED, starts[trace_id], None)] for trace_id in ids})
        for trace_id, events in stored.items():
            self.events.remember(trace_id, events)
            self.events.published(trace_id, events)
        return ids

    async def settle_ended(self, trace_id: str, status: str) -> None:
        """A run whose terminal event is stored but whose row was not updated (its owner
        died in between): the row in line with the event."""
        await self.set_run(trace_id, status=status, finished_at=utcnow(),
                           owner_process=None, lease_until=None)

    async def store_answer(self, trace_id: str, content: Any,
                           choose: Callable[[WorkflowRun | None, list[Question]], Question],
                           also: Callable[[Question], Awaitable[None]] | None = None) -> Question:
        """Store `content` as the answer to the question `choose(run, open questions)`
        picks (it raises to refuse), `also(question)` (an audit entry) too, with
        the step and run back to `running`, in one transaction any process may write: the
        run's row is locked, so replies to one run are taken one at a time."""
        chosen: list[Question] = []

        async def store() -> list[Event]:
            run = await self.run_row(trace_id, lock=True)
            open_ = [q for q in await self.events.questions(trace_id) if not q.answered] if run else []
            question = choose(run, open_)
            chosen[:] = [question]
            events = await self.events.insert(trace_id, [(
                EventKind.REPLY_RECEIVED,
                {"request_id": question.request_id, "content": content, "path": question.path},
                question.step_id,
            )])
            # Seen at once by any reader of the run; the owner writes the same.
            await self.set_step(trace_id, question.path, status=StepStatus.RUNNING)
            if len(open_) == 1:
                await self.db.aexecute(WorkflowRun.update(status=RunStatus.RUNNING).where(
                    (WorkflowRun.trace_id == trace_id) & (WorkflowRun.status == RunStatus.WAITING_REPLY)))
            if also is not None:
                await also(question)
            return events

        await self.write(trace_id, store, fenced=False)
        return chosen[0]

    # -- the event log --------------------------------------------------------------------
    async def append(self, trace_id: str, kind: str, data: dict[str, Any] | None = None, *,
                     step_id: At | str | None = None) -> Event:
        return await self.events.append(trace_id, kind, data, step_id=step_id)

    async def append_many(self, trace_id: str, items: list[Item]) -> list[Event]:
        return await self.events.append_many(trace_id, items)

    async def last_event(self, trace_id: str) -> Event | None:
        return await self.events.last_event(trace_id)

    async def max_seq(self, trace_id: str) -> int:
        return await self.events.max_seq(trace_id)

    async def questions(self, trace_id: str) -> list[Question]:
        return await self.events.questions(trace_id)

    async def release(self) -> None:
        """Give the current task's pooled connection back before a wait."""
        await self.events.release()
