"""The one model of a workflow template: its steps and options (SPEC §4, §7).

The template service validates every step with `Step` (so one 422 lists every problem,
with paths such as `steps.2.retry.max_attempts`), and the OpenAPI document describes the
same classes: what the document says is what the server checks. Rules that need more than
one field (references between steps, cycles, expressions, schemas) live in `validate.py`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestra.errors import ValidationError
from orchestra.money.amounts import USD_JSON_SCHEMA, parse_usd, usd_text

STEP_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STEPS = 50
PROMPT_MAX = 100_000
NAME_MAX = 128
EXPRESSION_MAX = 1_000
TIMEOUT_MAX = 86_400
NODE_NAMES = ("planner", "reviewer", "summarizer")  # services/node_specs.NODE_SPECS (checked in tests)
_NOT_BLANK = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


class Closed(BaseModel):
    """Strict types, unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


class WorkerAgent(Closed):
    worker: str = Field(description="One of the template owner's worker ids.")


class NodeAgent(Closed):
    node: Literal["planner", "reviewer", "summarizer"]


class HumanAgent(Closed):
    """The prompt is put to the client as a question; the reply is the step's output."""

    human: Literal[True]


class StepRetry(Closed):
    """Run a failed attempt again after backoff_seconds, doubling each time (±25 % jitter)."""

    max_attempts: int = Field(1, ge=1, le=10, description="Attempts in all, the first included.")
    backoff_seconds: float = Field(
        0, ge=0, le=3600, description="Wait before the second attempt; doubled for each next one."
    )


class StepTools(Closed):
    """What a tool call that fails does to an agent step."""

    on_tool_error: Literal["continue", "fail"] = Field(
        "continue", description="'continue' (default): the model reads the tool's error and goes on; "
        "'fail': the first tool error fails the step (then retry and on_error apply).")


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
HTTP_URL_MAX = 8_192
HTTP_HEADERS_MAX = 64
HTTP_HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$"  # an RFC 9110 token
HTTP_HEADER_VALUE_MAX = 8_192
HTTP_TIMEOUT_MAX = 600
MAX_CHAIN = 5  # runs in a parent/child chain, the top run included (SPEC §14)


class HttpCall(Closed):
    """An HTTP request (SPEC §14). `url`, header values and the strings of `body` may use
    `{{ }}`; `{{ secrets.NAME }}` only in `url` and header values. The output is `{status,
    headers, body}` (`body` parsed when the answer is JSON); a status >= 400 fails the step."""

    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    url: str = Field(max_length=HTTP_URL_MAX, pattern=_NOT_BLANK,
                     description="http(s)://…; obeys the users' egress rule (ORCHESTRA_STEP_EGRESS_ALLOW).")
    headers: dict[str, str] | None = Field(
        None, max_length=HTTP_HEADERS_MAX, description="Header names are tokens; values may use {{ }}.")
    body: Any = Field(None, description="A string (sent as it is) or any JSON value (sent as JSON); "
                      "{{ }} in its strings.")
    timeout_seconds: float = Field(30, gt=0, le=HTTP_TIMEOUT_MAX,
                                   description="Bound on the whole exchange (connect, send, redirects, "
                                   "every read), seconds (default 30).")


class ChildWorkflow(Closed):
    """Run another template as a child run (SPEC §14) and wait for it: its output is the
    step's output; a failed or cancelled child fails the step."""

    template: str = Field(min_length=1, max_length=128,
                          description="The id or name of a template the owner may run; not this one, "
                          "nor one that calls this one.")
    version: int | None = Field(None, ge=1, description="The template version to run (SPEC §13; default the latest).")
    input: str = Field(max_length=EXPRESSION_MAX, description="CEL expression: the child's input.")


CODE_SOURCE_MAX = 65_536  # bytes of a code step's source (SPEC §17)


class CodeCall(Closed):
    """Compute the step's output from data in a sandboxed subset of Python (SPEC §17): the
    value of the source's last expression (None otherwise). It sees `input`, `steps` and,
    inside a foreach, `item` and `index`; it may import json, math, datetime and re."""

    source: str = Field(min_length=1, description="The Python source, at most 65,536 bytes (UTF-8).")


MAX_CONCURRENCY = 64  # foreach items at once, at most (SPEC §8)
MAX_ITERATIONS = 100  # loop iterations, at most (SPEC §8)


class Foreach(Closed):
    """Run the step once per item of a list (SPEC §8): `item` and `index` in its expressions."""

    items: str = Field(max_length=EXPRESSION_MAX, description="CEL expression giving a list.")
    max_concurrency: int = Field(4, ge=1, le=MAX_CONCURRENCY, description="Items at once.")
    on_error: Literal["fail", "continue"] = Field(
        "fail", description="'continue': a failed item's result is null and the others go on.")


class Loop(Closed):
    """Run `steps` as a small workflow per iteration until `until` holds (SPEC §8)."""

    steps: list[Step] = Field(min_length=1, max_length=MAX_STEPS,
                              description="The inner steps, run once per iteration.")
    until: str = Field(max_length=EXPRESSION_MAX,
                       description="CEL condition over the iteration's `steps` and `loop`; true ends the loop.")
    max_iterations: int = Field(ge=1, le=MAX_ITERATIONS, description="Required: the loop ends after this many.")
    output: str | None = Field(
        None, max_length=EXPRESSION_MAX,
        description="CEL expression: the loop's output (default: the last inner step's output of the last iteration).")


class Step(Closed):
    """One step of a template: an agent or human call, an HTTP request, a child workflow,
    a code step, a `foreach` or a `loop`."""

    id: str = Field(description="Unique in the template, inner steps included.", pattern=STEP_ID.pattern)
    agent: WorkerAgent | NodeAgent | HumanAgent | None = Field(
        None, description="Required, except for a loop, a foreach with `steps`, an http, a workflow and a code step.")
    http: HttpCall | None = None
    code: CodeCall | None = None
    workflow: ChildWorkflow | None = None
    prompt: str | None = Field(
        None,
        description="Not blank; required with `agent`. `{{ expr }}` inserts a CEL expression's value (a string as "
        "it is, anything else as compact JSON); `{{input}}` and `{{steps.<id>.output}}` of an "
        "ancestor step keep their v1 meaning.",
        max_length=PROMPT_MAX,
        pattern=_NOT_BLANK,
    )
    foreach: Foreach | None = None
    steps: list[Step] | None = Field(
        None, min_length=1, max_length=MAX_STEPS,
        description="foreach only, instead of agent and prompt: a small workflow run per item.")
    output: str | None = Field(
        None, max_length=EXPRESSION_MAX,
        description="foreach with steps: CEL expression giving an item's result (default: its last step's output).")
    loop: Loop | None = None
    depends_on: list[str] | None = Field([], description="Ids of steps of this template.")
    when: str | None = Field(
        None,
        max_length=EXPRESSION_MAX,
        description="CEL condition, evaluated once the dependencies have ended: false skips "
        "the step (step_skipped, reason 'when').",
    )
    output_schema: dict[str, Any] | None = Field(
        None,
        description="JSON Schema (2020-12, at most 64 KiB, no remote $ref) of the step's output; "
        "the output is then a JSON value.",
    )
    timeout_seconds: int | None = Field(
        None, ge=1, le=TIMEOUT_MAX,
        description="An agent step's whole work (tool rounds included); a human step's wait.",
    )
    retry: StepRetry | None = None
    on_error: Literal["fail", "continue"] = Field(
        "fail", description="'continue': a failed step ends with a null output and the run goes on."
    )
    on_tool_error: Literal["continue", "fail"] | None = Field(
        None, description="Agent steps: 'continue' (default): the model reads a tool's error and goes on; "
        "'fail': the first tool error fails the attempt (then retry and on_error apply).")
    tools: StepTools | None = Field(
        None, description="Agent steps: `{on_tool_error}`, an alias of the step's own on_tool_error.")
    default: Any = Field(
        None,
        description="Human steps with timeout_seconds: the output when no reply came in time "
        "(validated against output_schema).",
    )


class TemplateLimits(Closed):
    """Bounds of a run: past either the run fails with an error naming the limit."""

    deadline_seconds: int | None = Field(
        None, ge=1, le=30 * 86_400, description="From run_started, waits included."
    )
    max_steps: int | None = Field(
        None, ge=1, le=100_000, description="Step executions: every attempt, item and iteration."
    )
    budget_usd: Any = Field(
        None, description="USD the run's model calls may cost at most (SPEC §12): a "
        "non-negative number or decimal string, kept as a decimal string.",
        json_schema_extra={"anyOf": [{"type": "null"}, *USD_JSON_SCHEMA["anyOf"]]})
    on_budget: Literal["fail", "pause"] | None = Field(
        None, description="When the budget cannot pay for the next call: fail the run "
        "(default), or pause it as waiting_budget until a top-up.")

    @field_validator("budget_usd")
    @classmethod
    def _money(cls, value: Any) -> str | None:
        if value is None:
            return None
        try:
            return usd_text(parse_usd(value, "budget_usd"))
        except ValidationError as exc:
            raise ValueError(exc.detail[0]["problem"]) from None


class Expose(Closed):
    """Where else the template is offered (SPEC §14)."""

    mcp: bool = Field(False, description="Offer the template as a tool of orchestra's MCP "
                      "server (`/mcp`) to every caller who may run it.")


class TemplateOptions(Closed):
    """The template-level parts of the workflow language (all optional)."""

    input_schema: dict[str, Any] | None = Field(
        None,
        description="JSON Schema (2020-12) of a run's input; input may then be any JSON value.",
    )
    limits: TemplateLimits | None = None
    output: str | None = Field(
        None, max_length=EXPRESSION_MAX,
        description="CEL expression: the run's output (default: the last listed step's output).",
    )
    output_schema: dict[str, Any] | None = Field(
        None,
        description="JSON Schema (2020-12) the run's output must satisfy; a run whose output "
        "does not fails naming the path. MCP tools declare it as their outputSchema.",
    )
    expose: Expose | None = None


Loop.model_rebuild()
