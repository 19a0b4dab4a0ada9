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
from orchestra.engine import instances
from orchestra.engine.language import schemas
from orchestra.engine.language.schemas import describe, violations
from orchestra.engine.log import Event
from orchestra.engine.vocabulary import FINISHED, EventKind, RunStatus, StepStatus
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.timestamps import parse_ts

if TYPE_CHECKING:
    from orchestra.engine.live import LiveRun


@dataclass
class Question:
    """A `reply_requested` of a run, and its answer once one is stored."""

    request_id: str
    step_id: str
    prompt: str
    answer: Any = None  # text, or a JSON value for a step with output_schema
    future: asyncio.Future | None = None
    answered: bool = False  # an answer (or a timeout's default) is stored
    path: str = ""  # the instance that asked (SPEC §8); a top-level step's is its id
    asked_at: float | None = None  # when it was asked (epoch seconds), as stored

    def __post_init__(self) -> None:
        self.path = self.path or getattr(self.step_id, "path", None) or self.step_id
        self.step_id = str(self.step_id)


async def read_questions(db: Any, trace_id: str) -> list[Question]:
    """Every question of a run, oldest first, with its answer where one is stored."""
    rows = await db.list(
        RunEvent.select(RunEvent.kind, RunEvent.data)
        .where((RunEvent.run == trace_id)
               & RunEvent.kind.in_([EventKind.REPLY_REQUESTED, EventKind.REPLY_RECEIVED,
                                    EventKind.REPLY_TIMED_OUT, EventKind.REPLY_WITHDRAWN]))
        .order_by(RunEvent.seq)
    )
    asked: dict[str, Question] = {}
    for row in rows:
        if row.data.get("child_trace_id"):  # a child run's question, shown here (SPEC §14)
            continue
        request_id = row.data.get("request_id")
        if row.kind == EventKind.REPLY_REQUESTED:
            asked[request_id] = Question(request_id, row.data.get("step_id"), row.data.get("prompt"),
                                         path=row.data.get("path") or "",
                                         asked_at=parse_ts(row.data.get("ts")))
        elif row.kind == EventKind.REPLY_WITHDRAWN:
            asked.pop(request_id, None)  # asked by an earlier attempt, and not again
        elif request_id in asked and not asked[request_id].answered:
            asked[request_id].answered = True
            asked[request_id].answer = row.data.get("content", "")
    return list(asked.values())


class CheckOutside(Exception):
    """A reply too large to check against its schema on the event loop (and inside the
    reply's write transaction): it is checked in the engine's sandbox first."""

    def __init__(self, schema: Any) -> None:
        super().__init__("check the reply in the sandbox")
        self.schema = schema


def check_reply(steps: list[dict[str, Any]], step_id: str, content: Any, *,
                checked: Any = None) -> None:
    """A reply fits its question: JSON of the human step's output_schema, else text.
    `checked`: a schema the reply was already found to fit (in the sandbox)."""
    step = next((s for s, _, _ in instances.walk(steps) if s.get("id") == step_id), {})  # inner ones too
    schema = step.get("output_schema") if step.get("agent", {}).get("human") else None
    if schema is None:
        if not isinstance(content, str):
            raise ValidationError.field("content", "must be a string (this question has no schema)")
        return
    if checked is not None and checked == schema:
        return
    if schemas.needs_sandbox(content, schema):
        raise CheckOutside(schema)
    found = violations(content, schema, root="content")
    if found:
        raise ValidationError(f"The reply does not match the step's schema: {describe(found)}.",
                              detail=found)


class HumanQuestions:
    """Engine part: asking questions, and answers reaching the run that waits on them."""

    async def open_questions(self, trace_id: str) -> list[dict[str, str]]:
        """`[{request_id, step_id, prompt}]` the run waits on, oldest first (from the store)."""
        return [
            {"request_id": q.request_id, "step_id": q.step_id, "prompt": q.prompt}
            | ({"path": q.path} if q.path != q.step_id else {})
            for q in await read_questions(self.db, trace_id) if not q.answered
        ]

    async def reply(self, trace_id: str, *, content: Any, request_id: str | None) -> Question:
        """Store the answer to an open question of the run (the oldest unless `request_id`)
        and deliver it to the run's owner, here or in another process. Exactly one answer
        is stored per question, whichever processes receive replies at once."""
        chosen: Question | None = None
        checked: Any = None

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
            open_ = [q for q in await read_questions(self.db, trace_id) if not q.answered]
            if not open_:
                raise ConflictError(f"The run is not waiting for a reply (status: {rows[0].status}).")
            chosen = open_[0] if request_id is None else next(
                (q for q in open_ if q.request_id == request_id), None)
            if chosen is None:
                raise ConflictError(
                    f"The request '{request_id}' is not waiting for a reply (stale or unknown).",
                    detail={"pending": [q.request_id for q in open_]},
                )
            check_reply(rows[0].steps, chosen.step_id, content, checked=checked)  # 422: it stays open
            events = await self.log.insert(trace_id, [(
                EventKind.REPLY_RECEIVED,
                {"request_id": chosen.request_id, "content": content, "path": chosen.path},
                chosen.step_id,
            )])
            # Seen at once by any reader of the run; the owner writes the same.
            await self._set_step(trace_id, chosen.path, status=StepStatus.RUNNING)
            if len(open_) == 1:
                await self.db.aexecute(WorkflowRun.update(status=RunStatus.RUNNING).where(
                    (WorkflowRun.trace_id == trace_id) & (WorkflowRun.status == RunStatus.WAITING_REPLY)))
            return events

        while True:
            try:
                await self._store_with_events(trace_id, store_answer, fenced=False)  # any process
                break
            except CheckOutside as outside:  # bounded, in the sandbox, outside the transaction
                found = await schemas.check(content, outside.schema, root="content",
                                            sandbox=self.request_sandbox)
                if found:
                    raise ValidationError(f"The reply does not match the step's schema: {describe(found)}.",
                                          detail=found) from None
                checked = outside.schema  # then stored, unless another question came first
        await self.log.release()
        chosen.answer, chosen.answered = content, True
        live = self.runs.get(trace_id)
        if live is not None:
            self._answer(live, chosen.request_id, content)
        else:
            await self.signals.notify("control", f"reply:{trace_id}")
        return chosen

    async def _time_out_question(self, live: LiveRun, sid: str, default: Any) -> None:
        """A human step's wait ran out and it has a `default`: close its open question
        (`reply_timed_out {request_id}`; a later reply is 409) and let the default stand."""
        open_ = [q for q in await read_questions(self.db, live.trace_id)
                 if not q.answered and q.path == getattr(sid, "path", sid)]
        await self.log.release()
        for question in open_:
            live.writes.submit(self.log.append, live.trace_id, EventKind.REPLY_TIMED_OUT,
                               live.tagged(sid, {"request_id": question.request_id, "content": default}),
                               step_id=sid)
        await live.writes.drain()
        if not live.questions:
            live.writes.submit(self._set_run, live.trace_id, status=RunStatus.RUNNING)

    def _answer(self, live: LiveRun, request_id: str, content: Any) -> None:
        question = live.questions.get(request_id)
        if question is not None and question.future is not None and not question.future.done():
            question.future.set_result(content)

    async def _check_replies(self, live: LiveRun) -> None:
        """Answers stored by other processes for the questions this run waits on."""
        if not live.questions:
            return
        try:
            for question in await read_questions(self.db, live.trace_id):
                if question.answered:
                    self._answer(live, question.request_id, question.answer)
        finally:
            await self.log.release()

    async def _store_asked(self, trace_id: str, path: str, items: list) -> None:
        """The run and the step `waiting_reply`, with the question's events, at once."""

        async def store() -> list[Event]:
            await self._set_run(trace_id, status=RunStatus.WAITING_REPLY)
            await self._set_step(trace_id, path, status=StepStatus.WAITING_REPLY)
            return await self.log.insert(trace_id, items) if items else []

        await self._store_with_events(trace_id, store)

    async def _ask(self, live: LiveRun, sid: str, prompt: str, *,
                   earlier: Question | None = None, schema: dict[str, Any] | None = None) -> Any:
        """Emit `reply_requested`, move the run to `waiting_reply`, wait for the answer.
        A question an earlier attempt asked is not asked again: its stored answer is
        used, or the same request is waited on. When the step asks something else, the
        open questions its earlier attempt asked are withdrawn first (`reply_withdrawn`:
        a reply to one of them is 409 from now on)."""
        if earlier is not None and earlier.answered:
            return earlier.answer
        question = earlier or Question(uuid.uuid4().hex, sid, prompt)
        question.future = asyncio.get_running_loop().create_future()
        path = question.path
        live.questions[question.request_id] = question
        live.waiting.add(path)
        writes = live.writes
        try:
            items: list = []
            if earlier is None:
                items = [(EventKind.REPLY_WITHDRAWN, {"request_id": old.request_id}, sid)
                         for old in live.withdraw(sid)]
                items.append((EventKind.REPLY_REQUESTED, live.tagged(sid, {
                    "request_id": question.request_id, "prompt": prompt,
                    **({"schema": schema} if schema is not None else {})}), sid))
            # The run and step show `waiting_reply` in the same transaction that stores
            # the question: whoever sees the status finds the question open.
            await asyncio.shield(writes.submit(self._store_asked, live.trace_id, path, items))
            if earlier is not None:
                await self._check_replies(live)  # answered while nobody held the run
            await self.log.release()
            content = await asyncio.shield(question.future)
        finally:
            live.questions.pop(question.request_id, None)
            live.waiting.discard(path)
        writes.submit(self._set_step, live.trace_id, path, status=StepStatus.RUNNING)
        if not live.questions:
            writes.submit(self._set_run, live.trace_id, status=RunStatus.RUNNING)
        return content
