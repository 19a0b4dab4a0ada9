"""Human questions: `reply_requested` asked by a step, answers taken from any process.

A question is asked by a human step or the `ask_user` tool; the answer is stored by
whichever process received it (`reply`, one answer per question) and reaches the owner
as a `reply` signal, or from the store on the next lease tick (`check_replies`). A
question an earlier attempt asked is not asked again: its stored answer is used, or the
same request is waited on.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from orchestra.db.models import WorkflowRun
from orchestra.db.signals import Signals
from orchestra.engine.live import LiveRun, LiveRuns
from orchestra.engine.model import At, Question, find_step, step_defs
from orchestra.engine.store import RunStore
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.language import schemas
from orchestra.language.sandbox import Sandbox
from orchestra.language.schemas import describe, violations
from orchestra.vocabulary import FINISHED, EventKind, RunStatus, StepStatus


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
    step = find_step(step_defs(steps), step_id)  # inner ones too
    schema = step.output_schema if step is not None and step.human else None
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


def open_questions(questions: list[Question]) -> list[dict[str, str]]:
    """`[{request_id, step_id, prompt}]` (and `path` inside a container) of the open ones."""
    return [
        {"request_id": q.request_id, "step_id": q.step_id, "prompt": q.prompt}
        | ({"path": q.path} if q.path != q.step_id else {})
        for q in questions if not q.answered
    ]


class Questions:
    """Asking questions, and answers reaching the run that waits on them."""

    def __init__(self, store: RunStore, runs: LiveRuns, signals: Signals,
                 request_sandbox: Sandbox) -> None:
        self.store = store
        self.runs = runs
        self.signals = signals
        self.request_sandbox = request_sandbox  # a reply's schema check (a request's work)

    async def open_questions(self, trace_id: str) -> list[dict[str, str]]:
        """The questions the run waits on, oldest first (from the store)."""
        return open_questions(await self.store.questions(trace_id))

    async def reply(self, trace_id: str, *, content: Any, request_id: str | None,
                    audit: Callable[[Question], Awaitable[None]] | None = None) -> Question:
        """Store the answer to an open question of the run (the oldest unless `request_id`)
        and deliver it to the run's owner, here or in another process. Exactly one answer
        is stored per question, whichever processes receive replies at once."""
        checked: Any = None

        def choose(run: WorkflowRun | None, open_: list[Question]) -> Question:
            if run is None:
                raise NotFoundError(f"No run has the trace_id '{trace_id}'.")
            if run.status in FINISHED or not open_:
                raise ConflictError(f"The run is not waiting for a reply (status: {run.status}).")
            chosen = open_[0] if request_id is None else next(
                (q for q in open_ if q.request_id == request_id), None)
            if chosen is None:
                raise ConflictError(
                    f"The request '{request_id}' is not waiting for a reply (stale or unknown).",
                    detail={"pending": [q.request_id for q in open_]},
                )
            check_reply(run.steps, chosen.step_id, content, checked=checked)  # 422: it stays open
            return chosen

        while True:
            try:
                chosen = await self.store.store_answer(trace_id, content, choose, audit)  # any process
                break
            except CheckOutside as outside:  # bounded, in the sandbox, outside the transaction
                found = await schemas.check(content, outside.schema, root="content",
                                            sandbox=self.request_sandbox)
                if found:
                    raise ValidationError(f"The reply does not match the step's schema: {describe(found)}.",
                                          detail=found) from None
                checked = outside.schema  # then stored, unless another question came first
        await self.store.release()
        chosen.answer, chosen.answered = content, True
        live = self.runs.get(trace_id)
        if live is not None:
            self.answer(live, chosen.request_id, content)
        else:
            await self.signals.notify("control", f"reply:{trace_id}")
        return chosen

    async def time_out(self, live: LiveRun, at: At, default: Any) -> None:
        """A human step's wait ran out and it has a `default`: close its open question
        (`reply_timed_out {request_id}`; a later reply is 409) and let the default stand."""
        open_ = [q for q in await self.store.questions(live.trace_id)
                 if not q.answered and q.path == at.path]
        await self.store.release()
        for question in open_:
            live.writes.submit(self.store.append, live.trace_id, EventKind.REPLY_TIMED_OUT,
                               live.tagged(at, {"request_id": question.request_id, "content": default}),
                               step_id=at)
        await live.writes.drain()
        if not live.questions:
            live.writes.submit(self.store.set_run, live.trace_id, status=RunStatus.RUNNING)

    @staticmethod
    def answer(live: LiveRun, request_id: str, content: Any) -> None:
        question = live.questions.get(request_id)
        if question is not None and question.future is not None and not question.future.done():
            question.future.set_result(content)

    async def check_replies(self, live: LiveRun) -> None:
        """Answers stored by other processes for the questions this run waits on."""
        if not live.questions:
            return
        try:
            for question in await self.store.questions(live.trace_id):
                if question.answered:
                    self.answer(live, question.request_id, question.answer)
        finally:
            await self.store.release()

    async def ask(self, live: LiveRun, at: At, prompt: str, *,
                  earlier: Question | None = None, schema: dict[str, Any] | None = None) -> Any:
        """Emit `reply_requested`, move the run to `waiting_reply`, wait for the answer.
        A question an earlier attempt asked is not asked again: its stored answer is
        used, or the same request is waited on. When the step asks something else, the
        open questions its earlier attempt asked are withdrawn first (`reply_withdrawn`:
        a reply to one of them is 409 from now on)."""
        if earlier is not None and earlier.answered:
            return earlier.answer
        question = earlier or Question(uuid.uuid4().hex, at.step_id, prompt, path=at.path)
        question.future = asyncio.get_running_loop().create_future()
        path = question.path
        live.questions[question.request_id] = question
        live.waiting.add(path)
        writes = live.writes
        try:
            items: list = []
            if earlier is None:
                items = [(EventKind.REPLY_WITHDRAWN, {"request_id": old.request_id}, at)
                         for old in live.withdraw(at)]
                items.append((EventKind.REPLY_REQUESTED, live.tagged(at, {
                    "request_id": question.request_id, "prompt": prompt,
                    **({"schema": schema} if schema is not None else {})}), at))
            # The run and step show `waiting_reply` in the same transaction that stores
            # the question: whoever sees the status finds the question open.
            await asyncio.shield(writes.submit(self.store.store_asked, live.trace_id, path, items))
            if earlier is not None:
                await self.check_replies(live)  # answered while nobody held the run
            await self.store.release()
            with live.waiting_for():  # no run slot held meanwhile (SPEC §15b)
                content = await asyncio.shield(question.future)
        finally:
            live.questions.pop(question.request_id, None)
            live.waiting.discard(path)
        writes.submit(self.store.set_step, live.trace_id, path, status=StepStatus.RUNNING)
        if not live.questions:
            writes.submit(self.store.set_run, live.trace_id, status=RunStatus.RUNNING)
        return content
