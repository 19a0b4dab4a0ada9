"""`/mcp`: orchestra as an MCP server over streamable HTTP (SPEC §14), on the official
SDK's server side (its low-level `Server` and `StreamableHTTPSessionManager`).

Every request is authenticated here first, by an access token or an API key (a key needs
`run:start`), exactly as the JSON API does; the caller rides the ASGI scope to the
handlers. Both protocol eras the SDK serves are served:

- 2026-07-28 (the SDK client's default): every request stands alone, so any process
  serves any request. A human step is asked as an `InputRequiredResult` carrying an
  elicitation; the client's retry brings the answer and a sealed `requestState` (the
  run's trace id and the question), sealed with a key derived from the JWT secret so
  that every process can open it, and bound to the caller.
- the handshake era (2024-11-05 … 2025-11-25): a session lives in the process that
  opened it (a load balancer keeps it there by `Mcp-Session-Id`; elsewhere it answers
  404 and the client opens a new one, as the protocol says). A human step is asked by
  an `elicitation/create` request on the call's stream.

Either way a call is a durable run: a client that hangs up leaves the run going, and its
trace id is in every answer. Template changes anywhere reach open sessions as
`notifications/tools/list_changed` (and listen streams as its 2026 event)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from sanic import Request

from orchestra import __version__
from orchestra.db.database import end_task_store_work
from orchestra.db.models import WorkflowRun
from orchestra.errors import ConflictError, NotFoundError, OrchestraError, PermissionDeniedError
from orchestra.services import mcp_tools, runs
from orchestra.services.mcp_tools import Ended, ExposedTools, Question, Tool
from orchestra.vocabulary import RunStatus
from orchestra.web import asgi_bridge
from orchestra.web.auth import Principal, bind

logger = logging.getLogger("orchestra.mcp")

PRINCIPAL = "orchestra.principal"  # the scope key the caller rides in
REPLY_KEY = "reply"  # the input request's key in an InputRequiredResult
NOTIFY_TIMEOUT = 2.0  # seconds a list_changed may take to reach one session
SESSIONS_MAX = 10_000
OPENINGS_PER_USER = 2  # session openings of one user served at once (the rest wait)


class PerUserTurns:
    """At most `width` at a time per user; a user with none running or waiting costs
    nothing here (the entry goes with its last holder)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._gates: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, user_id: str):
        gate, users = self._gates.setdefault(user_id, (asyncio.Semaphore(self.width), [0]))
        users[0] += 1
        try:
            async with gate:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                self._gates.pop(user_id, None)


class _Sessions(StreamableHTTPSessionManager):
    """The SDK's session manager, with a cap per user (SPEC §15b): a user opening one
    more handshake-era session than `per_user` closes their oldest (the newest stays
    open; other users' sessions are untouched), so one user cannot fill `max_sessions`."""

    def __init__(self, server: Server, *, per_user: int, max_sessions: int) -> None:
        super().__init__(server, max_sessions=max_sessions)
        self.per_user = per_user

    def _admit_session(self, requestor):
        transport = super()._admit_session(requestor)
        if transport is None or requestor is None:
            return transport
        subject = requestor.get("subject")
        theirs = [sid for sid, owner in self._session_owners.items() if owner.get("subject") == subject]
        for session_id in theirs[:max(0, len(theirs) - self.per_user)]:  # oldest first
            old = self._server_instances.pop(session_id, None)
            self._session_owners.pop(session_id, None)
            if old is not None and not old.is_terminated:
                task = asyncio.get_running_loop().create_task(old.terminate(), name="mcp-session-cap")
                _closing.add(task)
                task.add_done_callback(_closing.discard)
        return transport


_closing: set[asyncio.Task] = set()  # oldest sessions being closed past a user's cap


class _Server(Server):
    """The SDK's low-level server, announcing `tools.listChanged` in the handshake era."""

    def create_initialization_options(self, notification_options=None, experimental_capabilities=None,
                                      **kwargs: Any) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, **kwargs)


def _principal(ctx: ServerRequestContext) -> Principal:
    return ctx.request.scope[PRINCIPAL]


def credential_of(principal: Principal) -> str:
    """The credential a sealed `requestState` is bound to (SPEC §15b): an API key, or a
    sign-in's refresh family (its refreshed access tokens included) — never merely the
    user, so another key of the same user cannot bring the answer."""
    if principal.key is not None:
        return f"{principal.user_id}/key:{principal.key.key_id}"
    if principal.family:
        return f"{principal.user_id}/session:{principal.family}"
    return f"{principal.user_id}/token:{principal.issued_at}"


class McpEndpoint:
    """This process's MCP server: the SDK's server and session manager, the callers'
    tool lists, and the open sessions to tell when templates change."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.tools = ExposedTools(core)
        self.bus = InMemorySubscriptionBus()
        self.server = _Server(
            "orchestra", version=__version__, title="orchestra",
            instructions="Each tool runs an orchestra workflow template and answers its output.",
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
        )
        secret = hashlib.sha256(b"orchestra/mcp/request-state:"
                                + core.settings.load_secret_key().encode()).digest()
        self.server.middleware.append(RequestStateBoundary(
            RequestStateSecurity(keys=[secret], ttl=24 * 3600.0,
                                 bind_principal=lambda ctx: credential_of(_principal(ctx))),
            default_audience="orchestra"))
        self.manager = _Sessions(self.server, per_user=core.settings.max_mcp_sessions_per_user,
                                 max_sessions=SESSIONS_MAX)
        self._sessions: dict[str, Any] = {}  # handshake-era session id → its ServerSession
        self._openings = PerUserTurns(OPENINGS_PER_USER)
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        core.caches.register(["workflow_template"], self._templates_changed)

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        ready = asyncio.Event()

        async def run() -> None:
            async with self.manager.run():
                ready.set()
                await self._stop.wait()

        self._task = asyncio.get_running_loop().create_task(run(), name="mcp-sessions")
        await ready.wait()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 5)

    async def handle(self, request: Request, principal: Principal, *, opening: bool = False) -> None:
        """Serve one `/mcp` request of a caller the route authenticated (a key with
        `run:start`). `opening`: the request opens a session (`initialize`): one user's
        openings are served `OPENINGS_PER_USER` at a time, the rest wait their turn (holding
        no store connection), so a user opening sessions in a loop takes no more of this
        process's time than that from everybody else's requests."""
        # the session belongs to the user who opened it (the SDK compares this identity)
        owner = AuthenticatedUser(AccessToken(token="-", client_id="orchestra", scopes=[],
                                              subject=principal.user_id))
        scope = {PRINCIPAL: principal, "user": owner}
        if not opening:
            await asgi_bridge.serve(request, self.manager.handle_request, scope)
            return
        async with self._openings.turn(principal.user_id):
            await asgi_bridge.serve(request, self.manager.handle_request, scope)

    # --- tool list ------------------------------------------------------------------

    def _remember_session(self, ctx: ServerRequestContext) -> None:
        session_id = ctx.request.headers.get("mcp-session-id") if ctx.request is not None else None
        if session_id and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            if session_id not in self._sessions and len(self._sessions) >= SESSIONS_MAX:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[session_id] = ctx.session

    async def _list_tools(self, ctx: ServerRequestContext, params: Any) -> types.ListToolsResult:
        self._remember_session(ctx)
        principal = _principal(ctx)
        bind(principal)  # the session's task may be another request's
        try:
            tools = await self.tools.for_caller(principal.user_id, principal.key)
        finally:
            await end_task_store_work(self.core.db)
        return types.ListToolsResult(tools=[_tool(t) for t in tools])

    def _templates_changed(self) -> None:
        self.tools.invalidate()
        with contextlib.suppress(RuntimeError):  # no loop: nothing is open to be told
            asyncio.get_running_loop().create_task(self._tell_sessions(), name="mcp-list-changed")

    async def _tell_sessions(self) -> None:
        await self.bus.publish(ToolsListChanged())
        for session_id, session in list(self._sessions.items()):
            try:
                async with asyncio.timeout(NOTIFY_TIMEOUT):
                    await session.send_tool_list_changed()
            except Exception:  # noqa: BLE001 - a session that is gone is forgotten
                self._sessions.pop(session_id, None)

    # --- tool call ------------------------------------------------------------------

    async def _call_tool(self, ctx: ServerRequestContext,
                         params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
        self._remember_session(ctx)
        principal = _principal(ctx)
        bind(principal)  # the session's task may be another request's: its actor, its key's workspace
        try:
            return await self._call(ctx, principal, params)
        except OrchestraError as exc:
            return _error(exc.message)
        finally:
            await end_task_store_work(self.core.db)

    async def _call(self, ctx: ServerRequestContext, principal: Principal,
                    params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
        try:
            tool = await self.tools.find(principal.user_id, principal.key, params.name)
        except NotFoundError as exc:  # a protocol error, as MCP says of unknown tools
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        if params.request_state:  # a 2026 retry: the answer to the question asked before
            trace_id, after, finished = await self._answered(principal, params)
        else:
            run = await runs.start_run(
                self.core, user_id=principal.user_id, is_admin=False, template_id=tool.template_id,
                input=tool.run_input(params.arguments),
                trigger={"kind": "mcp", "tool": tool.name,
                         **({"key_id": principal.key.key_id} if principal.key else {})})
            trace_id, after, finished = run.trace_id, 0, 0

        async def progress(count: int, step_id: str) -> None:
            nonlocal finished
            finished = count
            await ctx.session.report_progress(count, None, f"step {step_id} finished")

        while True:
            await end_task_store_work(self.core.db)
            outcome = await mcp_tools.watch(self.core, trace_id, after=after, progress=progress,
                                            finished=finished)
            if isinstance(outcome, Ended):
                return _answer(trace_id, outcome, tool)
            if not _may_ask(ctx, principal):
                return _error(mcp_tools.how_to_reply(outcome))
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                return _input_required(trace_id, outcome, finished)
            result = await ctx.session.elicit_form(_ask(outcome), _form(outcome.schema),
                                                   related_request_id=ctx.request_id)
            if result.action != "accept":
                return _error(_unanswered(result.action, outcome))
            await mcp_tools.answer(self.core, user_id=principal.user_id, question=outcome,
                                   content=_content(outcome.schema, result.content))
            after = outcome.seq

    async def _answered(self, principal: Principal,
                        params: types.CallToolRequestParams) -> tuple[str, int, int]:
        """Apply the answer a 2026 retry brings; where the call's run then stands."""
        try:
            state = json.loads(params.request_state or "")
            trace_id, after, finished = state["trace_id"], int(state["after"]), int(state["finished"])
            question = Question(state["asked_on"], state["request_id"], state["step_id"], "", state["schema"],
                                after)
        except (ValueError, KeyError, TypeError):
            raise MCPError(types.INVALID_PARAMS, "Invalid requestState") from None
        await self._may_answer(principal, trace_id)
        response = (params.input_responses or {}).get(REPLY_KEY)
        if not isinstance(response, types.ElicitResult) or response.action != "accept":
            raise ConflictError(_unanswered(getattr(response, "action", None), question))
        await mcp_tools.answer(self.core, user_id=principal.user_id, question=question,
                               content=_content(question.schema, response.content))
        return trace_id, after, finished


    async def _may_answer(self, principal: Principal, trace_id: str) -> None:
        """An answer brought by a retry needs what `POST /reply` needs, now: a key with
        `run:reply` whose templates include the run's (SPEC §15b)."""
        key = principal.key
        if key is None:
            return
        if "run:reply" not in key.scopes:
            raise PermissionDeniedError("This API key lacks the scope 'run:reply': it cannot answer "
                                        f"the question of run {trace_id}.")
        if key.templates is not None:
            run = await WorkflowRun.aget_or_none(WorkflowRun.trace_id == trace_id)
            if run is None or not key.allows_template(run.template_id):
                raise PermissionDeniedError("This API key may not answer runs of that template.")


def _unanswered(action: str | None, question: Question) -> str:
    """What a call answers when the client declined, cancelled or skipped the question."""
    said = {"decline": "declined", "cancel": "cancelled"}.get(action or "", "not answered")
    return f"The question was {said}. " + mcp_tools.how_to_reply(question)


def _may_ask(ctx: ServerRequestContext, principal: Principal) -> bool:
    """The client can be asked (it declared elicitation, and its channel can carry a
    request), and the caller may answer (a key needs `run:reply`)."""
    if principal.key is not None and "run:reply" not in principal.key.scopes:
        return False
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return False
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or ctx.session.can_send_request


def _tool(tool: Tool) -> types.Tool:
    return types.Tool(name=tool.name, title=tool.title, description=tool.description,
                      input_schema=tool.tool_input_schema, output_schema=tool.tool_output_schema)


def _answer(trace_id: str, ended: Ended, tool: Tool) -> types.CallToolResult:
    if ended.status != RunStatus.SUCCEEDED:
        return _error(f"The run {trace_id} {ended.status}: {ended.error or 'no reason was given'}")
    text, structured = mcp_tools.output_parts(ended.output)
    if structured is None and tool.output_schema is not None:
        structured = {"result": ended.output}
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured,
                                meta={"orchestra/trace_id": trace_id})


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


# --- questions as elicitation -----------------------------------------------------------

_FLAT_TYPES = {"string", "number", "integer", "boolean"}


def _flat(schema: dict[str, Any] | None) -> bool:
    """A schema an elicitation form can carry as is: an object of primitive fields."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return False
    fields = schema.get("properties")
    return isinstance(fields, dict) and bool(fields) and all(
        isinstance(f, dict) and f.get("type") in _FLAT_TYPES for f in fields.values())


def _form(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The form the client shows: the step's own schema when it is flat, else one field
    `answer` (the reply text, or the JSON of the reply)."""
    if _flat(schema):
        return schema
    description = "Your answer." if schema is None else "Your answer, as JSON."
    return {"type": "object", "properties": {"answer": {"type": "string", "description": description}},
            "required": ["answer"]}


def _content(schema: dict[str, Any] | None, form: dict[str, Any] | None) -> Any:
    """The reply a filled-in form stands for."""
    form = form or {}
    if _flat(schema):
        return form
    answer = form.get("answer", "")
    if schema is None:
        return str(answer)
    try:
        return json.loads(answer) if isinstance(answer, str) else answer
    except ValueError:
        return answer  # the reply's own check names what is wrong


def _ask(question: Question) -> str:
    return f"{question.prompt}\n\n(orchestra run {question.trace_id}, step {question.step_id})"


def _input_required(trace_id: str, question: Question, finished: int) -> types.InputRequiredResult:
    request = types.ElicitRequest(params=types.ElicitRequestFormParams(
        message=_ask(question), requested_schema=_form(question.schema)))
    state = {"trace_id": trace_id, "after": question.seq, "finished": finished,
             "asked_on": question.trace_id, "request_id": question.request_id,
             "step_id": question.step_id, "schema": question.schema}
    return types.InputRequiredResult(result_type="input_required", input_requests={REPLY_KEY: request},
                                     request_state=json.dumps(state))
