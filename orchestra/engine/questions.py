"""Human questions: `reply_requested` asked by a step, answers taken from any process.

A question is asked by a human step or the `ask_user` tool; the answer is stored by
whichever process received it (`reply`, one answer per question) and reaches the owner
as a `reply` signal, or from the store on the next lease tick (`_check_replies`). A
question an earlier attempt asked is not asked again: its stored answer is used, or the
same request is waited on.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestra.db.models import RunEvent, WorkflowRun
from orchestra.engine.log import Event
from orchestra.engine.vocabulary import FINISHED, EventKind, RunStatus, StepStatus
from orchestra.errors import ConflictError, NotFoundError

if TYPE_CHECKING:
    from orchestra.engine.live import LiveRun


@dataclass
class Question:
    """A `reply_requested` of a run, and its answer once one is stored."""

    request_id: str
    step_id: str
    prompt: str
    answer: str | None = None
    future: asyncio.Future | None = None


async def read_questions(db: Any, trace_id: str) -> list[Question]:
    """Every question of a run, oldest first, with its answer where one is stored."""
    rows = await db.list(
        RunEvent.select(RunEvent.kind, RunEvent.data)
        .where((RunEvent.run == trace_id)
               & RunEvent.kind.in_([EventKind.REPLY_REQUESTED, EventKind.REPLY_RECEIVED]))
        .order_by(RunEvent.seq)
    )
    asked: dict[str, Question] = {}
    for row in rows:
        request_id = row.data.get("request_id")
        if row.kind == EventKind.REPLY_REQUESTED:
            asked[request_id] = Question(request_id, row.data.get("step_id"), row.data.get("prompt"))
        elif request_id in asked and asked[request_id].answer is None:
            asked[request_id].answer = str(row.data.get("content", ""))
    return list(asked.values())


class HumanQuestions:
    """Engine part: asking questions, and answers reaching the run that waits on them."""

    async def open_questions(self, trace_id: str) -> list[dict[str, str]]:
        """`[{request_id, step_id, prompt}]` the run waits on, oldest first (from the store)."""
        return [
            {"request_id": q.request_id, "step_id": q.step_id, "prompt": q.prompt}
            for q in await read_questions(self.db, trace_id) if q.answer is None
        ]

    async def reply(self, trace_id: str, *, content: str, request_id: str | None) -> Question:
        """Store the answer to an open question of the run (the oldest unless `request_id`)
        and deliver it to the run's owner, here or in another process. Exactly one answer
        is stored per question, whichever processes receive replies at once."""
        chosen: Question | None = None

        async def store_answer() -> list[Event]:
            nonlocal chosen
            query = WorkflowRun.select().where(WorkflowRun.trace_id == trace_id)
            if not self.exclusive:
                query = query.for_update()  # replies to one run, one at a time
            rows = await self.db.list(query)
            if not rows:
                raise NotFoundError(f"No run has the trace_id '{trace_id}'.")
            if rows[0].status in FINISHED:
                raise ConflictError(f"The run is not waiting for a reply (status: {rows[0].status}).")
            open_ = [q for q in await read_questions(self.db, trace_id) if q.answer is None]
            if not open_:
                raise ConflictError(f"The run is not waiting for a reply (status: {rows[0].status}).")
            chosen = open_[0] if request_id is None else next(
                (q for q in open_ if q.request_id == request_id), None)
            if chosen is None:
                raise ConflictError(
                    f"The request '{request_id}' is not waiting for a reply (stale or unknown).",
                    detail={"pending": [q.request_id for q in open_]},
                )
            events = await self.log.insert(trace_id, [(
                EventKind.REPLY_RECEIVED, {"request_id": chosen.request_id, "content": content},
                chosen.step_id,
            )])
            # Seen at once by any reader of the run; the owner writes the same.
            await self._set_step(trace_id, chosen.step_id, status=StepStatus.RUNNING)
            if len(open_) == 1:
                await self.db.aexecute(WorkflowRun.update(status=RunStatus.RUNNING).where(
                    (WorkflowRun.trace_id == trace_id) & (WorkflowRun.status == RunStatus.WAITING_REPLY)))
            return events

        await self._store_with_events(trace_id, store_answer)
        await self.log.release()
        chosen.answer = content
        live = self.runs.get(trace_id)
        if live is not None:
            self._answer(live, chosen.request_id, content)
        else:
            await self.signals.notify("control", f"reply:{trace_id}")
        return chosen

    def _answer(self, live: LiveRun, request_id: str, content: str) -> None:
        question = live.questions.get(request_id)
        if question is not None and question.future is not None and not question.future.done():
            question.future.set_result(content)

    async def _check_replies(self, live: LiveRun) -> None:
        """Answers stored by other processes for the questions this run waits on."""
        if not live.questions:
            return
        try:
            for question in await read_questions(self.db, live.trace_id):
                if question.answer is not None:
                    self._answer(live, question.request_id, question.answer)
        finally:
            await self.log.release()

    async def _ask(self, live: LiveRun, sid: str, prompt: str, *,
                   earlier: Question | None = None) -> str:
        """Emit `reply_requested`, move the run to `waiting_reply`, wait for the answer.
        A question an earlier attempt asked is not asked again: its stored answer is
        used, or the same request is waited on."""
        if earlier is not None and earlier.answer is not None:
            return earlier.answer
        question = earlier or Question(uuid.uuid4().hex, sid, prompt)
        question.future = asyncio.get_running_loop().create_future()
        live.questions[question.request_id] = question
        live.waiting.add(sid)
        writes = live.writes
        try:
            writes.submit(self._set_run, live.trace_id, status=RunStatus.WAITING_REPLY)
            writes.submit(self._set_step, live.trace_id, sid, status=StepStatus.WAITING_REPLY)
            if earlier is None:
                await asyncio.shield(writes.submit(
                    self.log.append, live.trace_id, EventKind.REPLY_REQUESTED,
                    {"request_id": question.request_id, "prompt": prompt}, step_id=sid,
                ))
            else:
                await self._check_replies(live)  # answered while nobody held the run
            await self.log.release()
            content = await asyncio.shield(question.future)
        finally:
            live.questions.pop(question.request_id, None)
            live.waiting.discard(sid)
        writes.submit(self._set_step, live.trace_id, sid, status=StepStatus.RUNNING)
        if not live.questions:
            writes.submit(self._set_run, live.trace_id, status=RunStatus.RUNNING)
        return content
