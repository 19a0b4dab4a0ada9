"""Workflow steps (SPEC §14): a durable child run per step instance, waited for without
holding a store connection, its end read from the child's own events.

The child's trace id is derived from the parent's, the instance's path and the attempt
(`child_id`), and the child is stored — with its step rows, the parent step's
`child_trace_id` and the parent's `child_started` — in one fenced transaction of the
parent's owner. So whoever runs the parent step again after a take-over finds the same
child and waits for it: a finished child is never run again, a running one goes on
under its own owner (a take-over of the child is an ordinary resume). The wait follows
the child's event feed (signals across processes; no poll, no connection held): a
child's `reply_requested` / `reply_received` are shown on the parent with
`child_trace_id` (answered on the child's trace), and its terminal event ends the wait.
While it waits the parent does not count against ORCHESTRA_MAX_RUNS (`child_waits`).

A parent that ends other than succeeded cancels its active descendants (all levels at
once, `cancel_descendants`); a step that times out cancels its child. A child template
deleted before or while the parent waits fails the step.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from orchestra.db.models import RunEvent, RunStep, WorkflowRun, WorkflowTemplate, utcnow
from orchestra.engine.language import schemas
from orchestra.engine.language.expressions import ExpressionError, Scope, text_of
from orchestra.engine.language.model import MAX_CHAIN
from orchestra.engine.live import LiveRun, StepAt, StepFailure
from orchestra.engine.vocabulary import ACTIVE, EventKind, RunStatus, StepStatus

logger = logging.getLogger("orchestra.engine")

_NAMESPACE = uuid.UUID("6f1c2b8e-4d0a-5e7f-9a3b-c5d6e7f80912")
TEMPLATE_CHECK_SECONDS = 2.0  # how often a waiting parent looks whether the child's template still exists
_MIRRORED = (EventKind.REPLY_REQUESTED, EventKind.REPLY_RECEIVED)


def child_id(parent_trace_id: str, path: str, attempt: int) -> str:
    """The child run of a step instance's attempt: the same id whoever computes it."""
    return str(uuid.uuid5(_NAMESPACE, f"{parent_trace_id}/{path}/{attempt}"))


class ChildSteps:
    """Engine part: one attempt of a `workflow` step, and the cancel of descendants."""

    async def _child_attempt(self, live: LiveRun, step: dict[str, Any], scope: Scope, attempt: int) -> Any:
        sid: StepAt = step["id"]
        flow = step["workflow"]
        child = child_id(live.trace_id, sid.path, attempt)
        live.child_waits += 1  # from now on this run holds no slot: the child may take it
        live.waiting.add(sid.path)
        try:
            if await WorkflowRun.aget_or_none(WorkflowRun.trace_id == child) is None:
                await self._start_child(live, sid, flow, scope, child)
            await self.log.release()
            run = await self._wait_for_child(live, sid, flow["template"], child)
        except asyncio.CancelledError:
            if not self.stopping and live.stop_status not in ("handback", "lost"):
                # the step ended without it (a timeout, a failed sibling): its child goes too
                task = asyncio.get_running_loop().create_task(self._cancel_tree(child, "The parent step ended."))
                self._child_tasks.add(task)
                task.add_done_callback(self._child_tasks.discard)
            raise
        finally:
            live.child_waits -= 1
            live.waiting.discard(sid.path)
        status, output, error = run
        live.writes.submit(self.log.append, live.trace_id, EventKind.CHILD_FINISHED, live.tagged(sid, {
            "child_trace_id": child, "path": sid.path, "status": status}), step_id=sid)
        if status != RunStatus.SUCCEEDED:
            raise StepFailure(f"The child run {child} ({flow['template']}) {status}"
                              + (f": {error}" if error else "."))
        return output

    async def _start_child(self, live: LiveRun, sid: StepAt, flow: dict[str, Any], scope: Scope,
                           child: str) -> None:
        """Store the child run (queued) with the parent's `child_started`, then submit it."""
        try:
            value = await scope.evaluate(flow["input"])
        except ExpressionError as exc:
            raise StepFailure(exc.message) from None
        template = await WorkflowTemplate.aget_or_none(WorkflowTemplate.id == flow["template"])
        if template is None or (template.owner_id != live.owner_id and not template.shared):
            raise StepFailure(f"The child template '{flow['template']}' no longer exists (or is no longer "
                              "yours to run).")
        if flow.get("version") is not None:
            raise StepFailure("This server keeps no template versions: workflow.version cannot be run.")
        parent = await WorkflowRun.aget_or_none(WorkflowRun.trace_id == live.trace_id)
        depth = ((parent.depth if parent is not None else 1) or 1) + 1
        if depth > MAX_CHAIN:
            raise StepFailure(f"The child run would be level {depth} of its chain; a chain holds at most "
                              f"{MAX_CHAIN} runs (the top run and four levels of children).")
        spec = template.spec or {}
        if "input_schema" in spec:
            found = await schemas.check(value, spec["input_schema"], root="input", sandbox=self.sandbox)
            if found:
                raise StepFailure(f"The child's input does not match {template.name}'s input_schema: "
                                  f"{schemas.describe(found)}")
            input_value, input_text = value, ""
        else:
            input_value, input_text = None, text_of(value)

        async def store() -> list:
            await self.db.aexecute(WorkflowRun.insert(
                trace_id=child, owner=live.owner_id, template=template.id, template_name=template.name,
                steps=template.steps, spec=template.spec, input=input_text, input_value=input_value,
                files=[], status=RunStatus.QUEUED, parent_trace_id=live.trace_id, parent_path=sid.path,
                depth=depth, created_at=utcnow()))
            await self.db.aexecute(RunStep.insert_many([
                {"run": child, "step_id": s["id"], "path": s["id"], "status": StepStatus.PENDING}
                for s in template.steps]))
            await self._set_step(live.trace_id, sid.path, child_trace_id=child)
            return await self.log.insert(live.trace_id, [(EventKind.CHILD_STARTED, live.tagged(sid, {
                "child_trace_id": child, "path": sid.path, "template_id": template.id}), sid)])

        stored = live.writes.submit(self._store_with_events, live.trace_id, store)
        await asyncio.shield(stored)
        await self.submit(child)

    async def _wait_for_child(self, live: LiveRun, sid: StepAt, template_id: str,
                              child: str) -> tuple[str, Any, str | None]:
        """(status, output, error) of the child once it ended; its questions shown here."""
        shown = await self._mirrored(live.trace_id, child)
        follow = self.feeds.follow(child, after=0, ping_every=TEMPLATE_CHECK_SECONDS)
        try:
            async for event in follow:
                if event is None:
                    if not await self._template_exists(template_id):
                        await self._cancel_tree(child, "Its template was deleted.")
                        raise StepFailure(f"The child template '{template_id}' was deleted while this step "
                                          f"waited for its run {child}.")
                    continue
                if event.kind in _MIRRORED and (event.kind, event.data.get("request_id")) not in shown:
                    shown.add((event.kind, event.data.get("request_id")))
                    data = {k: v for k, v in event.data.items() if k not in ("trace_id", "seq", "ts", "step_id")}
                    live.writes.submit(self.log.append, live.trace_id, event.kind, live.tagged(sid, {
                        **data, "child_trace_id": child, "child_step_id": event.data.get("step_id")}), step_id=sid)
                if event.terminal:
                    status = event.data.get("status") or {
                        EventKind.RUN_FINISHED: RunStatus.SUCCEEDED,
                        EventKind.RUN_CANCELLED: RunStatus.CANCELLED}.get(event.kind, RunStatus.FAILED)
                    error = event.data.get("error") or event.data.get("reason")
                    return status, event.data.get("output"), error
        finally:
            await follow.aclose()
            await self.log.release()
        raise StepFailure(f"The child run {child} ended without a terminal event.")

    async def _mirrored(self, trace_id: str, child: str) -> set[tuple[str, Any]]:
        """The child's questions this parent has shown already (a take-over follows again)."""
        rows = await self.db.list(RunEvent.select(RunEvent.kind, RunEvent.data).where(
            (RunEvent.run == trace_id) & RunEvent.kind.in_(list(_MIRRORED))))
        await self.log.release()
        return {(row.kind, row.data.get("request_id")) for row in rows if row.data.get("child_trace_id") == child}

    async def _template_exists(self, template_id: str) -> bool:
        found = await self.db.exists(WorkflowTemplate.select(WorkflowTemplate.id)
                                     .where(WorkflowTemplate.id == template_id))
        await self.log.release()
        return found

    async def cancel_descendants(self, trace_id: str, reason: str) -> None:
        """Cancel every active run below `trace_id` (all levels), all at once."""
        found, level = [], [trace_id]
        while level:
            rows = await self.db.list(WorkflowRun.select(WorkflowRun.trace_id).where(
                WorkflowRun.parent_trace_id.in_(level) & WorkflowRun.status.in_(list(ACTIVE))))
            level = [row.trace_id for row in rows]
            found += level
        await self.log.release()
        if found:
            await asyncio.gather(*(self.cancel(child, reason=reason) for child in found), return_exceptions=True)

    def cancel_descendants_soon(self, trace_id: str, reason: str) -> None:
        """`cancel_descendants` in the background (a run's end must not wait for it); a
        failure is logged, and the children's own parent-less runs end as runs do."""

        async def quietly() -> None:
            try:
                await self.cancel_descendants(trace_id, reason)
            except Exception:  # noqa: BLE001 - the store may be away, the engine stopping
                logger.warning("could not cancel the child runs of %s", trace_id, exc_info=True)

        task = asyncio.get_running_loop().create_task(quietly())
        self._child_tasks.add(task)
        task.add_done_callback(self._child_tasks.discard)

    @property
    def _child_tasks(self) -> set:
        tasks = self.__dict__.get("_child_task_set")
        if tasks is None:
            tasks = self.__dict__["_child_task_set"] = set()
        return tasks

    async def _cancel_tree(self, child: str, reason: str) -> None:
        try:
            await asyncio.gather(self.cancel(child, reason=reason), self.cancel_descendants(child, reason))
        except Exception:  # noqa: BLE001 - the child's own lease and cancel flag finish the job
            logger.warning("could not cancel child run %s", child, exc_info=True)
