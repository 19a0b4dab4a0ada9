"""The engine's typed run model: steps as frozen values, their kinds, the reasons a run's
task stops, instance paths, and questions.

A run's steps are stored as the template's JSON (`run.steps`); the engine reads them
once, at launch, through the language's `Step` model (`language/model.py`) into
`StepDef` values, so every part reads one typed definition with one set of defaults
instead of `dict.get(...)` calls that each pick their own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestra.language.model import Step


class StepKind(StrEnum):
    """What a step instance does; the scheduler's dispatch table is keyed by it."""

    CALL = "call"  # one agent, human, http, workflow or code call
    FOREACH = "foreach"  # one instance per item of a list (SPEC §8)
    LOOP = "loop"  # a small workflow per iteration, until a condition (SPEC §8)


class StopReason(StrEnum):
    """Why a live run's task was stopped from outside (`LiveRuns.stop`)."""

    CANCELLED = "cancelled"  # a cancel: the run ends `cancelled`
    INTERRUPTED = "interrupted"  # the run ends `interrupted`
    HANDBACK = "handback"  # the process stops: the run goes back to the store
    LOST = "lost"  # another process holds it now (or the lease ran out): write nothing


@dataclass(frozen=True, slots=True)
class AgentRef:
    """Who answers a call step: one of the owner's workers, a system node, or a human."""

    worker: str | None = None
    node: str | None = None
    human: bool = False

    def as_json(self) -> dict[str, Any]:
        """The agent as the template stored it (and as `step_started` shows it)."""
        if self.human:
            return {"human": True}
        if self.worker is not None:
            return {"worker": self.worker}
        return {"node": self.node}


@dataclass(frozen=True, slots=True)
class ForeachDef:
    items: str
    max_concurrency: int = 4
    continue_on_error: bool = False


@dataclass(frozen=True, slots=True)
class LoopDef:
    steps: tuple[StepDef, ...]
    until: str
    max_iterations: int
    output: str | None = None


@dataclass(frozen=True, slots=True)
class StepDef:
    """One step of a run's template, typed and frozen (built once per launch)."""

    id: str
    kind: StepKind
    agent: AgentRef | None = None
    prompt: str | None = None
    depends_on: tuple[str, ...] = ()
    when: str | None = None
    output_schema: Any = None
    timeout_seconds: int | None = None
    max_attempts: int = 1
    backoff_seconds: float = 0.0
    continue_on_error: bool = False  # on_error: continue
    #: "on_tool_error" or its alias "tools.on_tool_error" (the field that says `fail`); "": continue
    fail_on_tool_error: str = ""
    has_default: bool = False
    default: Any = None
    foreach: ForeachDef | None = None
    steps: tuple[StepDef, ...] = ()  # a foreach's small workflow per item
    output: str | None = None  # a foreach with steps: an item's output expression
    loop: LoopDef | None = None
    http: dict[str, Any] | None = None  # an HTTP request instead of an agent (SPEC §14)
    workflow: dict[str, Any] | None = None  # a child run instead of an agent (SPEC §14)
    code: dict[str, Any] | None = None  # {source}: computed in the code sandbox (SPEC §17)

    @property
    def human(self) -> bool:
        return self.agent is not None and self.agent.human

    @property
    def structured(self) -> bool:
        """The output is a JSON value (the step has an output_schema)."""
        return self.output_schema is not None

    @classmethod
    def from_step(cls, step: Step) -> StepDef:
        agent = None
        if step.agent is not None:
            raw = step.agent.model_dump()
            agent = AgentRef(worker=raw.get("worker"), node=raw.get("node"),
                             human=bool(raw.get("human")))
        foreach = loop = None
        if step.loop is not None:
            kind = StepKind.LOOP
            loop = LoopDef(tuple(cls.from_step(s) for s in step.loop.steps), step.loop.until,
                           step.loop.max_iterations, step.loop.output)
        elif step.foreach is not None:
            kind = StepKind.FOREACH
            foreach = ForeachDef(step.foreach.items, step.foreach.max_concurrency,
                                 step.foreach.on_error == "continue")
        else:
            kind = StepKind.CALL
        return cls(
            id=step.id, kind=kind, agent=agent, prompt=step.prompt,
            depends_on=tuple(step.depends_on or ()), when=step.when,
            output_schema=step.output_schema, timeout_seconds=step.timeout_seconds,
            max_attempts=step.retry.max_attempts if step.retry else 1,
            backoff_seconds=float(step.retry.backoff_seconds) if step.retry else 0.0,
            continue_on_error=step.on_error == "continue",
            fail_on_tool_error="on_tool_error" if step.on_tool_error == "fail" else (
                "tools.on_tool_error" if step.tools is not None and step.tools.on_tool_error == "fail" else ""),
            has_default="default" in step.model_fields_set, default=step.default,
            foreach=foreach, steps=tuple(cls.from_step(s) for s in step.steps or ()),
            output=step.output, loop=loop,
            http=step.http.model_dump() if step.http is not None else None,
            workflow=step.workflow.model_dump() if step.workflow is not None else None,
            code=step.code.model_dump() if step.code is not None else None,
        )


def step_defs(stored: list[dict[str, Any]]) -> tuple[StepDef, ...]:
    """A run's stored steps (the template's JSON) as typed definitions."""
    return tuple(StepDef.from_step(Step.model_validate(raw, strict=False)) for raw in stored)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """A run's template-level options (`run.spec`): its limits, output expression and schema."""

    deadline_seconds: int | None = None
    max_steps: int | None = None
    output: str | None = None
    on_budget: str = "fail"  # or "pause" (SPEC §12)
    output_schema: Any = None  # the output must satisfy it (SPEC §14: an MCP tool's outputSchema)

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> RunOptions:
        spec = spec or {}
        limits = spec.get("limits") or {}
        return cls(limits.get("deadline_seconds"), limits.get("max_steps"), spec.get("output"),
                   limits.get("on_budget") or "fail", spec.get("output_schema"))


def find_step(steps: tuple[StepDef, ...], step_id: str) -> StepDef | None:
    """The step with this id at any level (inner steps included)."""
    for step in steps:
        if step.id == step_id:
            return step
        inner = step.loop.steps if step.loop is not None else step.steps
        found = find_step(inner, step_id)
        if found is not None:
            return found
    return None


@dataclass(frozen=True, slots=True)
class At:
    """A step instance (SPEC §8): the template step's id and the instance's path
    (`research` and `research[3]`; a top-level step's path is its id). Events are
    tagged with both; rows and questions are keyed by the path."""

    step_id: str
    path: str

    @classmethod
    def top(cls, step_id: str) -> At:
        return cls(step_id, step_id)

    def __str__(self) -> str:
        return self.step_id


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
        self.path = self.path or self.step_id

