"""Workflow steps (SPEC §14): a durable child run per step instance, waited for without
holding a store connection, its end read from the child's own events.

The child's trace id is derived from the parent's, the instance's path and the attempt
(`child_id`), and the child is stored — with its step rows, the parent step's row
(`step_started`, `child_trace_id`) and the parent's `child_started` — in one fenced
transaction of the parent's owner (`store/children.py`), claimed in that same write
when this process has room (it starts at once: no claim round, nothing read back). So whoever runs the parent step again after a
take-over finds the same child and waits for it: a finished child is never run again, a
running one goes on under its own owner (a take-over of the child is an ordinary
resume). The wait follows the child's event feed (signals across processes; no poll, no
connection held): a child's `reply_requested` / `reply_received` are shown on the parent
with `child_trace_id` (answered on the child's trace), and its terminal event ends the
wait; `child_finished` is stored with the step's end (or retry) in one transaction.
While it waits the parent holds no run slot (`LiveRun.waiting_for`).

A parent that ends other than succeeded cancels its active descendants (all levels at
once, `Engine.cancel_below`: those whose cancel nobody asked yet, so a run ended by the
cancel of its whole tree asks nothing again); a step that ends without its child (a
timeout, a failed sibling) cancels that child and its own. A child template deleted before or while the parent waits
fails the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from orchestra.db.models import WorkflowRun, WorkflowTemplate, utcnow
from orchestra.engine.feed import Feeds
from orchestra.engine.live import LiveRun, StepFailure
from orchestra.engine.model import At, StepDef, StopReason
from orchestra.engine.records import Records
from orchestra.engine.spend import BudgetStop, Spending
from orchestra.engine.store import RunStore
from orchestra.engine.store.children import MIRRORED, ChildRuns, NewChild, mirror_key
from orchestra.language import schemas
from orchestra.language.expressions import ExpressionError, Scope, text_of
from orchestra.language.model import MAX_CHAIN
from orchestra.language.sandbox import Sandbox
from orchestra.vocabulary import EventKind, RunStatus, StepStatus

logger = logging.getLogger("orchestra.engine")

_NAMESPACE = uuid.UUID("6f1c2b8e-4d0a-5e7f-9a3b-c5d6e7f80912")
TEMPLATE_CHECK_SECONDS = 2.0  # how often a waiting parent looks whether the child's template still exists
_OWN_FIELDS = ("trace_id", "seq", "ts", "step_id", "path", "attempt")  # the parent's event has its own
_TERMINAL_STATUS = {EventKind.RUN_FINISHED: RunStatus.SUCCEEDED, EventKind.RUN_CANCELLED: RunStatus.CANCELLED}


def _usd(text: Any) -> Decimal | None:
    return None if text is None else Decimal(str(text))


def child_id(parent_trace_id: str, path: str, attempt: int) -> str:
    """The child run of a step instance's attempt: the same id whoever computes it."""
    return str(uuid.uuid5(_NAMESPACE, f"{parent_trace_id}/{path}/{attempt}"))


def _answers(asked: tuple[float, asyncio.Task[bool]] | None, now: float) -> bool:
    """Whether a look of this period answers: in flight, or done with an answer (one that
    failed or was cancelled is asked again)."""
    if asked is None or now - asked[0] >= TEMPLATE_CHECK_SECONDS:
        return False
    look = asked[1]
    return not look.done() or (not look.cancelled() and look.exception() is None)


class TemplateCheck:
    """Whether child templates still exist, for every waiting parent of this process: one
    store query per template per TEMPLATE_CHECK_SECONDS, however many parents wait on it
    (each of a 16 x 16 tree's 272 waiting parents asked on its own, ~136 queries a second
    on the event loop). A parent's answer is at most that old, as its own look was."""

    KEPT = 1_000  # templates remembered at most; past it, the answers of earlier periods go

    def __init__(self, exists: Callable[[str], Awaitable[bool]], release: Callable[[], Awaitable[None]]) -> None:
        self._exists = exists
        self._release = release
        self._asked: dict[str, tuple[float, asyncio.Task[bool]]] = {}  # template id: (when, the look)

    async def exists(self, template_id: str) -> bool:
        now = time.monotonic()
        asked = self._asked.get(template_id)
        if not _answers(asked, now):
            if len(self._asked) >= self.KEPT:
                self._asked = {k: v for k, v in self._asked.items() if now - v[0] < TEMPLATE_CHECK_SECONDS}
            asked = (now, asyncio.create_task(self._look(template_id)))
            self._asked[template_id] = asked
        return await asyncio.shield(asked[1])  # a waiter cancelled leaves the look to the others

    async def _look(self, template_id: str) -> bool:
        try:
            return await self._exists(template_id)
        finally:
            await self._release()


class ChildSteps:
    """Engine part: one attempt of a `workflow` step, and the cancel of descendants.
    `claim_now`, `begin` and `cancel_below` are the engine's (`Engine.claim_now`, …)."""

    def __init__(self, *, store: RunStore, records: Records, feeds: Feeds, sandbox: Sandbox,
                 stopping: Callable[[], bool], claim_now: Callable[[str], dict[str, Any]],
                 begin: Callable[[WorkflowRun], Awaitable[None]], cancel_below: Callable[..., Awaitable[None]],
                 tree_max_active: int = 256) -> None:
        self.store = store
        self.tree_max_active = tree_max_active  # ORCHESTRA_CHILD_TREE_MAX_ACTIVE
        self.children = ChildRuns(store)
        self.templates = TemplateCheck(self.children.template_exists, store.release)
        self.records = records
        self.feeds = feeds
        self.sandbox = sandbox
        self.stopping = stopping
        # A claim's columns when this process has room to run a child at once (else {}),
        # and the start of a run just stored (adopted when claimed, else submitted).
        self.claim_now = claim_now
        self.begin = begin
        self.cancel_below = cancel_below
        self._tasks: set[asyncio.Task] = set()

    async def attempt(self, live: LiveRun, step: StepDef, at: At, scope: Scope, attempt: int,
                      started: dict[str, Any]) -> Any:
        """Start (or find) the attempt's child run and wait for its end; its output.
        `started`: the attempt's `step_started` data, stored with the child (one write)."""
        flow = step.workflow
        child = child_id(live.trace_id, at.path, attempt)
        live.waits += 1  # from now on this run holds no slot: the child may take it
        live.waiting.add(at.path)
        try:
            exists, depth = await self.children.lookup(live.trace_id, child)
            if exists:  # a take-over: wait for the child the earlier owner started
                self.records.attempt_started(live, at, attempt, started)
                shown = await self.children.shown(live.trace_id, child)
            else:
                await self._start(live, at, attempt, started, flow, scope, child, depth + 1)
                shown = set()  # a child just started has asked nothing yet
            await self.store.release()
            status, output, error, over = await self._wait(live, at, flow["template"], child, shown)
        except asyncio.CancelledError:
            # not when the run's whole tree was cancelled: the child was asked with it
            if not (self.stopping() or live.tree_cancelled) and live.stop_reason not in (StopReason.HANDBACK,
                                                                                          StopReason.LOST):
                self.in_background(self._cancel_tree(child, "Its parent step ended."))
            raise
        finally:
            live.waits -= 1
            live.waiting.discard(at.path)
        Spending.child_ended(live, at.path, await self.children.spent(child))
        await self.store.release()
        finished = {"child_trace_id": child, "path": at.path, "status": status}
        if over is not None and status == RunStatus.FAILED:  # stopped by a budget above it: so is this run
            self.records.event(live, at, EventKind.CHILD_FINISHED, finished)
            raise BudgetStop(_usd(over.get("budget_usd")), _usd(over.get("spent_usd")),
                             trace_id=over.get("budget_trace_id"), on_budget="fail",
                             next_call=_usd(over.get("next_call_usd")), workspace_id=over.get("workspace_id"),
                             workspace_name=over.get("workspace_name") or "", month=over.get("month"))
        # stored with the step's end (or its retry): one transaction, not two
        self.records.carry(live, at, EventKind.CHILD_FINISHED, finished)
        if status != RunStatus.SUCCEEDED:
            raise StepFailure(f"The child run {child} ({flow['template']}) {status}"
                              + (f": {error}" if error else "."))
        return output

    async def _start(self, live: LiveRun, at: At, attempt: int, started: dict[str, Any],
                     flow: dict[str, Any], scope: Scope, child: str, depth: int) -> None:
        """Store the child run with the attempt's `step_started` and the parent's
        `child_started` in one write, then start it. A step that cannot start
        its child stores its `step_started` alone, then fails."""
        try:
            new = await self._new_child(live, flow, scope, child, depth)
        except StepFailure:
            self.records.attempt_started(live, at, attempt, started)
            raise
        data = live.tagged(at, {"child_trace_id": child, "path": at.path, "template_id": new.template.id})
        items = [(EventKind.STEP_STARTED, live.tagged(at, started), at), (EventKind.CHILD_STARTED, data, at)]
        values = {"status": StepStatus.RUNNING, "attempt": attempt} | ({"started_at": utcnow()} if attempt == 1 else {})
        # the reads above hold this task's connection: give it back before waiting for the
        # writer, which needs one (eight items starting children at once held a SQLite
        # pool of eight, and their writers waited out the pool's timeout)
        await self.store.release()
        full = await asyncio.shield(live.writes.submit(self._store_child, live.trace_id, at, new, values, items))
        await self.store.release()
        if full is not None:
            self.records.attempt_started(live, at, attempt, started)
            raise StepFailure(full)

    async def _store_child(self, parent: str, at: At, new: NewChild, values: dict[str, Any],
                           items: list) -> str | None:
        """The parent's write that stores the child, then the child's start: claimed in
        that same write when this process has room (it starts here at once), else queued
        for whoever claims it. One write of the parent's writer, so a cancel of the
        waiting step cannot come between the two. Not when the parent's tree of child
        runs holds ORCHESTRA_CHILD_TREE_MAX_ACTIVE active runs already: then nothing is
        stored and the reason is returned (counted in the parent's writer, so the
        children of one parent, a foreach's included, are counted one after another)."""
        root, active = await self.children.tree_active(parent)
        if active >= self.tree_max_active:
            await self.store.release()
            return (f"The child run would be one too many: the tree of child runs under {root} has "
                    f"{active} active runs, the most ORCHESTRA_CHILD_TREE_MAX_ACTIVE "
                    f"({self.tree_max_active}) allows.")
        run = await self.children.start(parent, at, new, values, items, claim=self.claim_now)
        await self.store.release()
        try:  # never raised into the writer: it would store the child again
            await self.begin(run)
        except Exception:  # noqa: BLE001 - the child is stored: a claim round (or its lease's end) starts it
            logger.warning("child run %s stored but not started here", run.trace_id, exc_info=True)
        return None

    async def _may_call(self, live: LiveRun, template: WorkflowTemplate) -> bool:
        """Whether the run may start a child of `template`: a shared one, one of the run's
        owner's, or one of the run's team workspace, whoever made it (SPEC §16: a team
        template's child is any template of that workspace)."""
        if template.shared or template.owner_id == live.owner_id:
            return True
        return template.workspace_id == live.workspace_id and await self.children.is_team(live.workspace_id)

    async def _new_child(self, live: LiveRun, flow: dict[str, Any], scope: Scope, child: str,
                         depth: int) -> NewChild:
        """The child run to store: its template's (or pinned version's) steps, its input
        checked; StepFailure when it cannot start."""
        try:
            value = await scope.evaluate(flow["input"])
        except ExpressionError as exc:
            raise StepFailure(exc.message) from None
        template = await self.children.template(flow["template"])
        if template is None or not await self._may_call(live, template):
            raise StepFailure(f"The child template '{flow['template']}' no longer exists (or is no longer "
                              "yours to run).")
        steps, spec, number = template.steps, template.spec, template.version or None
        if flow.get("version") is not None and flow["version"] != template.version:
            pinned = await self.children.version(template.id, flow["version"])
            if pinned is None:
                raise StepFailure(f"The child template '{template.name}' has no version {flow['version']} "
                                  f"(its latest is {template.version}).")
            steps, spec, number = pinned.steps, pinned.spec, pinned.version
        if depth > MAX_CHAIN:
            raise StepFailure(f"The child run would be level {depth} of its chain; a chain holds at most "
                              f"{MAX_CHAIN} runs (the top run and four levels of children).")
        if "input_schema" in (spec or {}):
            found = await schemas.check(value, spec["input_schema"], root="input", sandbox=self.sandbox)
            if found:
                raise StepFailure(f"The child's input does not match {template.name}'s input_schema: "
                                  f"{schemas.describe(found)}")
            return NewChild(child, live.owner_id, template, depth, "", value, steps, spec, number)
        return NewChild(child, live.owner_id, template, depth, text_of(value), None, steps, spec, number)

    async def _wait(self, live: LiveRun, at: At, template_id: str, child: str,
                    shown: set[tuple[str, Any]]) -> tuple[str, Any, str | None, dict[str, Any] | None]:
        """(status, output, error, budget_exceeded) of the child once it ended — the last
        is the data of its `budget_exceeded` when a budget above the child stopped it;
        its questions and pauses for budget shown here (`shown`: those the parent shows
        already)."""
        over = None
        follow = self.feeds.follow(child, after=0, ping_every=TEMPLATE_CHECK_SECONDS)
        try:
            async for event in follow:
                if event is None:
                    await self._template_still_there(template_id, child)
                    continue
                key = mirror_key(event.kind, event.data, event.seq)
                if event.kind in MIRRORED and key not in shown:
                    shown.add(key)
                    data = {k: v for k, v in event.data.items() if k not in _OWN_FIELDS}
                    if event.kind == EventKind.BUDGET_EXHAUSTED:
                        data["child_seq"] = event.seq
                    self.records.event(live, at, event.kind, {
                        **data, "child_trace_id": child, "child_step_id": event.data.get("step_id"),
                        "child_path": event.data.get("path")})
                if event.kind == EventKind.BUDGET_EXCEEDED and (  # a budget above the child: its workspace's too
                        event.data.get("budget_trace_id") not in (None, child) or event.data.get("workspace_id")):
                    over = event.data
                if event.terminal:
                    status = event.data.get("status") or _TERMINAL_STATUS.get(event.kind, RunStatus.FAILED)
                    return (status, event.data.get("output"), event.data.get("error") or event.data.get("reason"),
                            over)
        finally:
            await follow.aclose()
            await self.store.release()
        raise StepFailure(f"The child run {child} ended without a terminal event.")

    async def _template_still_there(self, template_id: str, child: str) -> None:
        if not await self.templates.exists(template_id):
            await self._cancel_tree(child, "Its template was deleted.")
            raise StepFailure(f"The child template '{template_id}' was deleted while this step "
                              f"waited for its run {child}.")

    # -- cancelling descendants ---------------------------------------------------------
    def cancel_descendants_soon(self, trace_id: str, reason: str) -> None:
        """A run ended other than succeeded: its unfinished descendants are cancelled (all
        levels at once, `Engine.cancel_below`) in the background (its end does not wait).
        Those asked already (their whole tree was cancelled) are left alone."""
        self.in_background(self.cancel_below(trace_id, reason))

    async def _cancel_tree(self, child: str, reason: str) -> None:
        await self.cancel_below(child, reason, itself=True)

    def in_background(self, work: Awaitable[None]) -> None:
        """Run `work` as a kept task; a failure is logged (the children's own leases and
        cancel flags finish the job)."""

        async def quietly() -> None:
            try:
                await work
            except Exception:  # noqa: BLE001 - the store may be away, the engine stopping
                logger.warning("could not cancel child runs", exc_info=True)

        task = asyncio.get_running_loop().create_task(quietly())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Let the background cancels finish (a little)."""
        if self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(list(self._tasks), timeout=2)
