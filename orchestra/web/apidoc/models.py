"""The shapes of what the API answers, for the OpenAPI document.

Request bodies are described by the models that validate them (in the blueprints);
these describe the answers the services' `*_view` functions build, so a client
generator gets real types and schemathesis can check every answer against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestra import vocabulary
from orchestra.engine.llm.factory import SUPPORTED_KINDS
from orchestra.language.model import Expose, Step, TemplateLimits
from orchestra.services.roles import ROLE_NAMES
from orchestra.services.uploads import MAX_FILES

Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
RoleName = Literal[tuple(ROLE_NAMES)]  # type: ignore[valid-type]
ProviderKind = Literal[SUPPORTED_KINDS]  # type: ignore[valid-type]
RunStatus = Literal[tuple(s.value for s in vocabulary.RunStatus)]  # type: ignore[valid-type]
StepStatus = Literal[tuple(s.value for s in vocabulary.StepStatus)]  # type: ignore[valid-type]


class Shape(BaseModel):
    """Base of answer shapes: answers may grow fields, so extra ones are allowed."""

    model_config = ConfigDict(extra="allow")


class Error(Shape):
    """The one error body of every route (SPEC §1)."""

    message: str = Field(description="A readable sentence.")
    error: str = Field(description="The error name, e.g. ValidationError.", pattern=r"^[A-Za-z]+$")
    detail: Any = Field(
        default=None,
        description="Optional. For ValidationError a list of {field, problem}; elsewhere what the route says.",
    )


class Success(Shape):
    message: Literal["success"]


def NextCursor() -> Any:  # noqa: N802 - reads as the field's type
    return Field(description="Pass as ?cursor= for the next page; null on the last page.")


# --- auth --------------------------------------------------------------------------------


class Registered(Success):
    user_id: str


class LoggedIn(Success):
    token: str = Field(description="The access token (the same as access_token).")
    access_token: str
    refresh_token: str


class TokenPair(Success):
    access_token: str
    refresh_token: str


class AuthorityChanged(Success):
    user_id: str
    new_authority: RoleName


class UserRow(Shape):
    user_id: str
    user_name: str
    role: RoleName


class UserList(Success):
    users: list[UserRow]


# --- providers, tools, skills ---------------------------------------------------------


class ProviderView(Shape):
    provider_id: str
    id: str = Field(description="The same as provider_id.")
    name: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16); null: instance-wide, "
                                     "usable by every workspace's workers.")
    provider: ProviderKind
    model_id: str
    base_url: str | None
    api_key: str | None = Field(description="Masked, e.g. sk-…abcd; null when none is kept.")
    has_api_key: bool
    prices: dict[str, str] | None = Field(description=(
        "The provider's own prices (USD per million tokens, decimal strings), or null."))
    price: dict[str, str] | None = Field(description=(
        "The price that applies now: input_per_mtok, output_per_mtok, cached_input_per_mtok "
        "and source (provider | genai-prices); null: the model has no known price."))
    limits: dict[str, int] | None = Field(description=(
        "requests_per_minute, tokens_per_minute, max_concurrency (each optional), or null."))
    created_at: Timestamp


class Provider(Success, ProviderView):
    pass


class ProviderList(Success):
    providers: list[ProviderView]


class ProviderCheck(Success):
    ok: bool = Field(description="true: the provider listed its models; false: see `error`.")
    models: list[str] = Field(None, description="Only when ok: the model ids, sorted.")
    error: str = Field(None, description="Only when not ok: why, in a sentence (never the provider's body).")


class Tool(Shape):
    name: str = Field(description="A built-in name, or `<server name>.<tool name>` for an MCP tool.")
    description: str
    parameters: dict[str, Any] = Field(description="A JSON Schema of the tool's arguments.")
    source: Literal["builtin"] | dict[str, str] = Field(
        description='"builtin", or {"mcp": server_id} for a tool of an MCP server.'
    )


class ToolList(Success):
    tools: list[Tool]


class McpTool(Shape):
    name: str = Field(description="The catalog name: `<server name>.<tool name>`.")
    tool: str = Field(description="The tool's own name on its server.")
    description: str
    parameters: dict[str, Any] = Field(description="A JSON Schema of the tool's arguments.")


class McpServerView(Shape):
    server_id: str
    id: str = Field(description="The same as server_id.")
    name: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16); null: instance-wide, "
                                     "its tools usable by every workspace's workers.")
    transport: Literal["streamable_http", "stdio"]
    url: str | None
    headers: dict[str, str] = Field(description="Header names with masked values (…abcd).")
    command: str | None
    args: list[str]
    env: dict[str, str] = Field(description="Variable names with masked values (…abcd).")
    timeout_seconds: float
    tools: list[McpTool] = Field(description="What the last successful listing found.")
    last_error: str | None = Field(description="Why the last connection failed; null after a success.")
    refreshed_at: Timestamp | None
    created_at: Timestamp
    updated_at: Timestamp


class McpServer(Success):
    server_id: str
    server: McpServerView


class McpServerList(Success):
    servers: list[McpServerView]


class SkillView(Shape):
    skill_id: str
    id: str
    name: str
    description: str
    instructions: str
    created_at: Timestamp
    updated_at: Timestamp


class Skill(Success, SkillView):
    pass


class SkillList(Success):
    skills: list[SkillView]


class SecretView(Shape):
    name: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16); null: instance-wide, "
                                     "usable by every workspace's runs.")
    hint: str = Field(description="'…' and the value's last four characters (none of a value under 8).")
    hosts: list[str] | None = Field(description="Where HTTP steps may send it, each entry in its canonical "
                                    "spelling; null for a secret stored before hosts existed, which no "
                                    "step may send until an administrator sets them.")
    created_at: Timestamp
    updated_at: Timestamp


class Secret(Success, SecretView):
    pass


class SecretList(Success):
    secrets: list[SecretView]


# --- workers, nodes -------------------------------------------------------------------


class WorkerView(Shape):
    worker_id: str
    id: str
    owner_id: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16).")
    name: str
    description: str
    system_prompt: str
    provider_id: str
    provider_name: str | None
    model: str | None = Field(description="null: the provider's model_id.")
    tools: list[str]
    bound_skill: str | None
    created_at: Timestamp
    updated_at: Timestamp


class Worker(Success, WorkerView):
    pass


class WorkerList(Success):
    workers: list[WorkerView]
    next_cursor: str | None = NextCursor()


class NodeView(Shape):
    name: str
    description: str
    provider: str | None = Field(description="A provider_id, or null when none is set.")
    provider_name: str | None
    model: str | None
    tools: list[str]
    updated_at: Timestamp | None


class Node(Success, NodeView):
    pass


class NodeList(Success):
    nodes: list[NodeView]


class Reloaded(Success):
    workers: int
    nodes: int


# --- uploads ----------------------------------------------------------------------------


class UploadedFile(Shape):
    file_id: str
    filename: str
    size: int = Field(ge=0)
    content_type: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class StoredFile(UploadedFile):
    created_at: Timestamp


class Uploaded(Success):
    files: list[UploadedFile]


class FileList(Success):
    files: list[StoredFile]
    next_cursor: str | None = NextCursor()


class UploadForm(BaseModel):
    """multipart/form-data: one or more parts named `file`, each with a file name."""

    file: list[Annotated[bytes, Field(json_schema_extra={"format": "binary", "type": "string"})]] = Field(
        min_length=1, max_length=MAX_FILES
    )


# --- workflows ----------------------------------------------------------------------------


class TemplateView(Shape):
    template_id: str
    name: str
    description: str
    shared: bool
    owner_id: str
    workspace_id: str | None = Field(description="The workspace it belongs to (SPEC §16).")
    steps: list[Step] = Field(description="The steps as validated (fields left out take their defaults).")
    input_schema: dict[str, Any] | None = Field(None, description="Only when the template has one.")
    limits: TemplateLimits | None = Field(None, description="Only when the template has them.")
    output: str | None = Field(None, description="Only when the template has one.")
    output_schema: dict[str, Any] | None = Field(None, description="Only when the template has one.")
    expose: Expose | None = Field(None, description='`{"mcp": true}` when offered as an MCP tool (`/mcp`).')
    version: int = Field(ge=1, description="The latest version: every save makes one (SPEC §13).")
    created_at: Timestamp
    updated_at: Timestamp


class Template(Success):
    template_id: str
    template: TemplateView


class TemplateList(Success):
    templates: list[TemplateView]
    next_cursor: str | None = NextCursor()


class Problem(Shape):
    field: str = Field(description="Where: a path such as steps.2.when or input_schema.type.")
    problem: str


class TemplateCheck(Success):
    valid: bool = Field(description="True when problems is empty: the template may be saved.")
    problems: list[Problem]


class TemplateDeleted(Success):
    template_id: str


class RunStarted(Success):
    trace_id: str
    status: Literal["queued"]


class RunReplayed(Success):
    """A start already made with this Idempotency-Key (or webhook-id): nothing new started."""

    trace_id: str = Field(description="The run the first request started.")
    status: RunStatus = Field(description="That run's status now.")


class RunRetried(RunStarted):
    retry_of: str = Field(description="The run whose succeeded steps this one reuses.")


class ParentRun(Shape):
    trace_id: str
    path: str = Field(description="The parent's step instance (a workflow step) that started this run.")


class ForkSource(Shape):
    trace_id: str = Field(description="The run forked.")
    from_step: str | None = Field(description="The step the fork ran again from, if one was named.")


class RunSummary(Shape):
    trace_id: str
    template_id: str | None = Field(description="null once the template is deleted.")
    template_name: str
    owner_id: str = Field(description="Who started it.")
    workspace_id: str | None = Field(description="Its template's workspace (SPEC §16).")
    status: RunStatus
    error: str | None
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    retry_of: str | None = Field(None, description="The run this one retries (POST /run/{trace_id}/retry).")
    cost_usd: str | None = Field(None, description=(
        "What the run's model calls cost (USD, exact decimal string), reservations of calls "
        "lost in a crash included; null when no call was priced."))
    budget_usd: str | None = Field(None, description="The run's budget (USD); null: none.")
    parent: ParentRun | None = Field(None, description="A child run (SPEC §14): the run and step instance that "
                                     "started it; null for a top run.")
    trigger: dict[str, Any] | None = Field(
        None, description="What started the run: null for a person or an API key; "
        '{"kind": "webhook", "hook_id", "webhook_id"} or {"kind": "schedule", "schedule_id", "due_at"}.')
    template_version: int | None = Field(None, description="The template version the run runs (null for runs "
                                         "started before versions existed).")
    forked_from: ForkSource | None = Field(None, description="The run this one forks (POST /run/{trace_id}/fork).")


class RunList(Success):
    runs: list[RunSummary]
    next_cursor: str | None = NextCursor()


class Usage(Shape):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(None, description="The part of prompt_tokens read from the provider's cache.")


class StepState(Shape):
    step_id: str
    path: str = Field(description="The instance's key in the run (the step id; under loops research[3]).")
    agent: dict[str, Any] | None = Field(description="The step's agent as its template reads back "
                                         "(agent.worker: the worker's name); null for an http or workflow step.")
    depends_on: list[str]
    status: StepStatus
    attempt: int = Field(ge=1, description="The attempt that ran last (retry policy).")
    reused: bool = Field(description="Copied from the run this one retries or forks (or set by the fork's "
                                     "outputs); its provider was not called.")
    output: Any = Field(description="Text, or a JSON value for a step with output_schema; null when skipped.")
    error: str | None
    usage: Usage | None
    cost_usd: str | None = Field(None, description=(
        "USD its model calls cost (failed attempts included), exact; null: none priced."))
    child_trace_id: str | None = Field(None, description="A workflow step's child run (SPEC §14).")
    started_at: Timestamp | None
    finished_at: Timestamp | None


class AttachedFile(Shape):
    file_id: str
    filename: str


class PendingReply(Shape):
    request_id: str
    step_id: str | None
    prompt: str


class RunDetailView(RunSummary):
    input: Any = Field(description="The text input, or the JSON value under the template's input_schema.")
    output: Any = Field(description="The run's output (the template's `output`, as `run_finished` gave it); "
                                    "null until the run succeeds.")
    files: list[AttachedFile]
    steps: list[StepState]
    pending_replies: list[PendingReply]
    last_seq: int = Field(ge=0)


class RunDetail(Success, RunDetailView):
    run: RunDetailView


class StoredEvent(Shape):
    seq: int = Field(ge=1)
    kind: str = Field(description="One of the event kinds of the SSE stream.")
    data: dict[str, Any]


class EventList(Success):
    events: list[StoredEvent]
    next_after: int | None = Field(
        description="Pass as ?after= for the next page; null when no more events are stored yet.", ge=1)


class Cancelled(Success):
    trace_id: str
    status: RunStatus


class BudgetRaised(Success):
    trace_id: str
    status: RunStatus
    cost_usd: str | None
    budget_usd: str | None = Field(description="The raised budget (of budget_trace_id's run).")
    budget_trace_id: str = Field(description=(
        "The run whose budget was raised: this one, or — a child run stopped by a budget above it "
        "(SPEC §14) — that run."))


class UsageRow(Shape):
    key: str | None = Field(description="The user, template, provider id or model; the UTC date for day.")
    name: str | None = Field(None, description="The user's, template's or provider's name (only grouped by those).")
    runs: int = Field(ge=0)
    calls: int = Field(ge=0)
    input_tokens: int = Field(ge=0, description="Prompt tokens, cached ones included.")
    output_tokens: int = Field(ge=0)
    cost_usd: str | None = Field(description="USD (exact decimal string); null: nothing priced.")


class UsageReport(Success):
    rows: list[UsageRow]


class Replied(Success):
    trace_id: str
    request_id: str
    step_id: str | None


class Done(Success):
    """A success with nothing more to say (deletes)."""
