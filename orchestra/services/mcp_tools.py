"""The templates orchestra offers as MCP tools (SPEC §14), and what a tool call does with
its run, independent of the protocol: which tools a caller sees, the run a call starts,
and how the run's events turn into progress, a question or the call's answer.

A caller sees the templates they may start (their own and shared ones; an API key's
`templates` narrow that) whose `expose: {"mcp": true}` is set. An API key sees those of
its workspace only (SPEC §16), and shared ones: a team workspace's templates (its user's
role there, `runner` at least, is checked by the gate at every request), or in its user's
personal workspace the user's own. Tool names are template
names reduced to `[A-Za-z0-9_-]`, at most 64 characters, made unique per caller with a
suffix (`_2`, `_3`, … in the order the templates were created). Each caller's list is kept
in this process until a template changes on any process (the `cache` signal)."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from orchestra.db.database import release_connection
from orchestra.db.models import WorkflowTemplate
from orchestra.engine import reads
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.services import runs
from orchestra.services.api_keys import KeyGrant
from orchestra.services.shared import Shared
from orchestra.vocabulary import EventKind

NAME_MAX = 64
TOOLS_MAX = 1000  # tools one caller is offered (the oldest first)
TEXT_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The text {{input}} stands for."}},
}
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class Tool:
    """One template offered as a tool to one caller."""

    name: str
    template_id: str
    title: str
    description: str
    input_schema: dict[str, Any] | None  # the template's own; None: the input is text
    output_schema: dict[str, Any] | None

    @property
    def tool_input_schema(self) -> dict[str, Any]:
        """What the tool declares: the template's input_schema when it is an object's
        schema; any other schema is offered as `{input: <schema>}`; none, `{input: string}`."""
        schema = self.input_schema
        if schema is None:
            return TEXT_INPUT_SCHEMA
        if schema.get("type") == "object":
            return schema
        return {"type": "object", "properties": {"input": schema}, "required": ["input"]}

    @property
    def tool_output_schema(self) -> dict[str, Any] | None:
        """The template's output_schema as an object's schema (`{result: …}` otherwise),
        the shape `structuredContent` is answered in."""
        schema = self.output_schema
        if schema is None:
            return None
        if schema.get("type") == "object":
            return schema
        return {"type": "object", "properties": {"result": schema}, "required": ["result"]}

    def run_input(self, arguments: dict[str, Any] | None) -> Any:
        """The run's input from the call's arguments (the inverse of tool_input_schema)."""
        arguments = arguments or {}
        if self.input_schema is None:
            text = arguments.get("input", "")
            if not isinstance(text, str):
                raise ValidationError.field("input", "must be a string (this tool takes text)")
            return text
        if self.input_schema.get("type") == "object":
            return arguments
        if "input" not in arguments:
            raise ValidationError.field("input", "is required")
        return arguments["input"]


def tool_name(template_name: str) -> str:
    """A template's name reduced to `[A-Za-z0-9_-]`, at most 64 characters."""
    reduced = _NOT_NAME.sub("_", template_name).strip("_")
    return (reduced or "template")[:NAME_MAX]


def _unique(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"_{n}"
        name = base[:NAME_MAX - len(suffix)] + suffix
    taken.add(name)
    return name


def _exposed(template: WorkflowTemplate) -> bool:
    return bool(((template.spec or {}).get("expose") or {}).get("mcp"))


class ExposedTools:
    """Each caller's tools, kept until any template changes (`invalidate`)."""

    def __init__(self, core: Shared) -> None:
        self.core = core
        self._lists: dict[str, list[Tool]] = {}
        self.generation = 0  # grows on every change: a list read before one is not kept

    def invalidate(self) -> None:
        self._lists.clear()
        self.generation += 1

    async def for_user(self, user_id: str) -> list[Tool]:
        """Every tool `user_id` may call (a key's `templates` are applied by `for_caller`)."""
        return await self._listed(user_id, WorkflowTemplate.owner == user_id)

    async def for_key(self, user_id: str, key: KeyGrant) -> list[Tool]:
        """Every tool a key of `user_id` may call: its workspace's and shared templates."""
        if key.workspace_id is None:
            return await self.for_user(user_id)
        if key.personal:
            mine = (WorkflowTemplate.owner == user_id) & (
                (WorkflowTemplate.workspace_id == key.workspace_id) | WorkflowTemplate.workspace_id.is_null())
        else:
            mine = WorkflowTemplate.workspace_id == key.workspace_id
        return await self._listed(f"{user_id}@{key.workspace_id}", mine)

    async def _listed(self, cached_as: str, mine: Any) -> list[Tool]:
        found = self._lists.get(cached_as)
        if found is not None:
            return found
        generation = self.generation
        query = (WorkflowTemplate.select()
                 .where(mine | (WorkflowTemplate.shared == True))  # noqa: E712
                 .order_by(WorkflowTemplate.created_at, WorkflowTemplate.id))
        tools: list[Tool] = []
        taken: set[str] = set()
        for template in await self.core.db.list(query):
            if not _exposed(template):
                continue
            spec = template.spec or {}
            tools.append(Tool(
                name=_unique(tool_name(template.name), taken), template_id=template.id,
                title=template.name, description=template.description or template.name,
                input_schema=spec.get("input_schema"), output_schema=spec.get("output_schema")))
            if len(tools) >= TOOLS_MAX:
                break
        await release_connection(self.core.db)
        if generation == self.generation:
            self._lists[cached_as] = tools
        return tools

    async def for_caller(self, user_id: str, key: KeyGrant | None) -> list[Tool]:
        if key is None:
            return await self.for_user(user_id)
        tools = await self.for_key(user_id, key)
        if key.templates is None:
            return tools
        return [tool for tool in tools if key.allows_template(tool.template_id)]

    async def find(self, user_id: str, key: KeyGrant | None, name: str) -> Tool:
        for tool in await self.for_caller(user_id, key):
            if tool.name == name:
                return tool
        raise NotFoundError(f"No tool is named '{name}'.")


# --- a call's run ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Question:
    """An open question of the call's run (or of one of its child runs)."""

    trace_id: str  # the run that asked it: where the answer goes
    request_id: str
    step_id: str
    prompt: str
    schema: dict[str, Any] | None
    seq: int  # where the call's run stood when it was asked


@dataclass(frozen=True, slots=True)
class Ended:
    """The call's run ended: its status, output and error."""

    status: str
    output: Any
    error: str | None


Progress = Callable[[int, str], Awaitable[None]]  # (steps finished so far, what finished)


async def watch(core: Shared, trace_id: str, *, after: int, progress: Progress,
                finished: int = 0) -> Question | Ended:
    """Follow the run from event `after` until it ends or asks a question that is still
    open. `progress` is told of each finished top-level step."""
    follow = core.engine.follow(trace_id, after=after, ping_every=15.0)
    try:
        async for event in follow:
            if event is None:
                continue
            if event.terminal:
                data = event.data
                return Ended(data.get("status") or event.kind, data.get("output"),
                             data.get("error") or data.get("reason"))
            if event.kind == EventKind.STEP_FINISHED and _top_level(event.data):
                finished += 1
                await progress(finished, str(event.data.get("step_id") or ""))
            elif event.kind == EventKind.REPLY_REQUESTED:
                question = await _still_open(core, trace_id, event.seq, event.data)
                if question is not None:
                    return question
    finally:
        await follow.aclose()
    raise ConflictError(f"The run {trace_id} stopped without ending.")  # pragma: no cover


def _top_level(data: dict[str, Any]) -> bool:
    """A top-level step's own instance (not an item, iteration or inner step of one)."""
    path = data.get("path")
    return path is None or path == data.get("step_id")


async def _still_open(core: Shared, trace_id: str, seq: int, data: dict[str, Any]) -> Question | None:
    """The question an event asked, if nobody has answered it yet (it is read from the
    store: when the stream is caught up from the start, a later answer may follow)."""
    asked_on = data.get("child_trace_id") or trace_id
    open_ones = await reads.open_questions(core.db, asked_on)
    await release_connection(core.db)
    for row in open_ones:
        if row["request_id"] == data.get("request_id"):
            return Question(asked_on, row["request_id"], row["step_id"], row["prompt"],
                            data.get("schema"), seq)
    return None


async def answer(core: Shared, *, user_id: str, question: Question, content: Any) -> None:
    """Reply to `question` as the caller; a question answered meanwhile is let be."""
    try:
        await runs.reply(core, user_id=user_id, is_admin=False, trace_id=question.trace_id,
                              content=content, request_id=question.request_id)
    except ConflictError:
        pass  # answered (or withdrawn) elsewhere: the run goes on either way
    finally:
        await release_connection(core.db)


def output_parts(output: Any) -> tuple[str, dict[str, Any] | None]:
    """A run's output as the call's text and structured content: JSON (anything but a
    string) is structured — an object as is, any other value as `{"result": value}`."""
    if isinstance(output, str):
        return output, None
    text = json.dumps(output, ensure_ascii=False)
    return text, output if isinstance(output, dict) else {"result": output}


def how_to_reply(question: Question) -> str:
    """What a caller whose client cannot be asked is told."""
    return (f"The run {question.trace_id} waits for a human reply to step '{question.step_id}': "
            f"{question.prompt!r}. Answer it with POST /api/v1/workflow/reply/{question.trace_id} "
            f'{{"content": …, "request_id": "{question.request_id}"}} (or `orchestra workflow reply`); '
            "the run then goes on.")
