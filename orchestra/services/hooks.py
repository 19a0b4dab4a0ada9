"""Inbound webhooks (SPEC §11): a public URL per hook that starts a run of its template
as its owner when a call is signed per Standard Webhooks (the `standardwebhooks`
package verifies: `webhook-id`, `webhook-timestamp` within 5 minutes, `webhook-signature`
`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`).

Nothing is written for a call that fails verification. A verified call's `webhook-id`
is remembered for 24 hours in the run's own transaction (services/run_starts.py), so a
sender's retry — on any process, racing or not — answers the first run's `trace_id`
and starts nothing; a call refused for any reason leaves no trace, and its retry is
tried afresh. The run's input is the hook's `input` expression (CEL over `body`,
`headers`, `query`), evaluated within the engine's expression bounds.
"""

from __future__ import annotations

import base64
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from standardwebhooks import Webhook

from orchestra import json_body  # strict RFC 8259 parsing, as for every request body
from orchestra.db.access_models import WebhookHook
from orchestra.db.models import User, WorkflowTemplate, iso, storable
from orchestra.errors import (
    AuthenticationRequiredError,
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
    TokenInvalidError,
    ValidationError,
)
from orchestra.language import expressions
from orchestra.services import audit, run_starts, workspace_scope
from orchestra.services.run_access import may_run, require_runnable
from orchestra.services.run_starts import Started, StartKey
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action

BODY_MAX = 1024 * 1024  # bytes of a call's body (exactly 1 MiB is accepted)
HOOKS_MAX = 100  # hooks one user may have
WEBHOOK_ID_MAX = run_starts.KEY_MAX
VARIABLES = frozenset({"body", "headers", "query"})
DEFAULT_INPUT = "body"
SECRET_BYTES = 32
_VERIFIERS_MAX = 1024


@dataclass(frozen=True, slots=True)
class Call:
    """One call to a hook as it arrived."""

    body: bytes
    content_type: str
    headers: dict[str, str]  # lower-case names, first value of each
    query: dict[str, str]  # first value of each name


# --- management -------------------------------------------------------------------------


def check_input(source: str) -> str:
    """The hook's `input` expression, or 422 naming `input`."""
    _, problems = expressions.check(source, allowed=VARIABLES)
    if problems:
        raise ValidationError.field("input", problems[0])
    return source


async def create_hook(core: Shared, *, owner_id: str, template_id: str,
                      input: str = DEFAULT_INPUT, workspace_id: str | None = None) -> tuple[WebhookHook, str]:
    """Store a hook of `owner_id` in `workspace_id` (an editor's there; default their
    personal workspace) on a template of that workspace they may run; the row and its
    signing secret (`whsec_…`, returned this once)."""
    source = check_input(input)
    workspace_id = await workspace_scope.target(core, owner_id, workspace_id, Action.EDIT)
    [template] = await require_runnable(core, user_id=owner_id, template_ids=[template_id],
                                        field="template_id", workspace_id=workspace_id)
    count = await core.db.count(WebhookHook.select().where(WebhookHook.owner == owner_id))
    if count >= HOOKS_MAX:
        raise ValidationError.field("template_id", f"you have {HOOKS_MAX} hooks, the limit; delete one first")
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()
    async with core.write_transaction():
        hook = await WebhookHook.acreate(owner=owner_id, template=template.id, input=source,
                                         secret_encrypted=core.secrets.encrypt(secret),
                                         workspace_id=workspace_id)
        await audit.record(core, action="hook.create", target=_target(hook, template),
                           changes={"template_id": audit.change(None, template.id),
                                    "input": audit.change(None, source),
                                    "secret": audit.change(None, secret, secret=True)},
                           workspace_id=workspace_id)
    hook.template = template
    return hook, secret


def _target(hook: WebhookHook, template: WorkflowTemplate) -> dict[str, Any]:
    """A hook's entry names it by its template's name (a hook has none)."""
    return audit.target("hook", hook.id, template.name)


def hook_view(hook: WebhookHook, url: str) -> dict[str, Any]:
    return {
        "hook_id": hook.id,
        "url": url,
        "template_id": hook.template_id,
        "template_name": hook.template.name,
        "workspace_id": hook.workspace_id,
        "input": hook.input,
        "created_at": iso(hook.created_at),
    }


def _with_template():
    return WebhookHook.select(WebhookHook, WorkflowTemplate).join(
        WorkflowTemplate, on=(WebhookHook.template == WorkflowTemplate.id))


async def list_hooks(core: Shared, *, owner_id: str, workspace_id: str | None = None) -> list[WebhookHook]:
    """The caller's hooks and their team workspaces' (`workspace_id`: that one's only)."""
    where = await workspace_scope.owned_where(core, owner_id, workspace_id, WebhookHook.owner,
                                              WebhookHook.workspace_id)
    return await core.db.list(
        _with_template().where(where).order_by(WebhookHook.created_at, WebhookHook.id))


async def _find(core: Shared, hook_id: str) -> WebhookHook | None:
    if len(hook_id) > 36 or not storable(hook_id):
        return None
    rows = await core.db.list(_with_template().where(WebhookHook.id == hook_id))
    return rows[0] if rows else None


async def get_hook(core: Shared, *, owner_id: str, hook_id: str, action: Action = Action.READ) -> WebhookHook:
    """A hook the caller may read (`action` edit: delete): their own, or one of a team
    workspace by their role there; else 404 (403 for a member below the role)."""
    hook = await _find(core, hook_id)
    missing = NotFoundError(f"No hook of yours has the id '{hook_id[:80]}'.")
    if hook is None:
        raise missing
    await workspace_scope.check_owned(core, owner_id, hook.owner_id, hook.workspace_id, action, missing)
    return hook


async def delete_hook(core: Shared, *, owner_id: str, hook_id: str) -> None:
    hook = await get_hook(core, owner_id=owner_id, hook_id=hook_id, action=Action.EDIT)
    async with core.write_transaction():
        if await core.db.aexecute(WebhookHook.delete().where(WebhookHook.id == hook.id)):
            await audit.record(core, action="hook.delete", target=_target(hook, hook.template),
                               changes={"template_id": audit.change(hook.template_id, None),
                                        "input": audit.change(hook.input, None),
                                        "secret": audit.change(hook.secret_encrypted, None, secret=True)},
                               workspace_id=audit.workspace_of(hook))


# --- calls --------------------------------------------------------------------------------


async def find_for_call(core: Shared, hook_id: str) -> WebhookHook:
    """The hook a public call names (404 when there is none)."""
    hook = await _find(core, hook_id)
    if hook is None:
        raise NotFoundError("No such hook.")
    return hook


def _verifier(core: Shared, hook: WebhookHook) -> Webhook:
    """The hook's verifier (its secret decrypted once per process, keyed by ciphertext)."""
    cache: OrderedDict[str, Webhook] = core.hook_verifiers
    verifier = cache.get(hook.secret_encrypted)
    if verifier is None:
        verifier = Webhook(core.secrets.decrypt(hook.secret_encrypted))
        cache[hook.secret_encrypted] = verifier
        if len(cache) > _VERIFIERS_MAX:
            cache.popitem(last=False)
    return verifier


def verify(core: Shared, hook: WebhookHook, call: Call) -> str:
    """The call's `webhook-id` once its signature and timestamp check out; else 401
    (nothing is written for such a call)."""
    headers = {name: call.headers.get(name, "") for name in
               ("webhook-id", "webhook-timestamp", "webhook-signature")}
    if not all(headers.values()):
        raise AuthenticationRequiredError(
            "Sign the call per Standard Webhooks: webhook-id, webhook-timestamp and "
            "webhook-signature are required.")
    try:
        _verifier(core, hook).verify(call.body, headers, json_parse=False)
    except Exception:  # noqa: BLE001 - any failure (bad base64, not UTF-8, stale) is a refusal
        raise TokenInvalidError(
            "The webhook signature does not verify (wrong secret, altered body, or a "
            "timestamp more than 5 minutes away).") from None
    webhook_id = headers["webhook-id"]
    if len(webhook_id) > WEBHOOK_ID_MAX or not storable(webhook_id):
        raise ValidationError.field("webhook-id", f"must be at most {WEBHOOK_ID_MAX} characters")
    return webhook_id


def _body_value(call: Call) -> Any:
    """The body as the expression sees it: JSON when it is JSON (by its content type, or
    none given), else its text."""
    content_type = call.content_type.split(";")[0].strip().lower()
    is_json = content_type in ("", "application/json") or content_type.endswith("+json")
    if is_json and call.body.strip():
        try:
            return json_body.parse(call.body)
        except json_body.JSONBodyError as exc:
            if content_type:
                raise BadRequestError(str(exc)) from None
    return call.body.decode("utf-8", "replace")


async def run_input(core: Shared, hook: WebhookHook, call: Call) -> Any:
    """The run's input: the hook's expression over the call (422 naming `input` when it
    fails or passes a bound); text for a template without an input_schema."""
    body = _body_value(call)
    if hook.input.strip() == DEFAULT_INPUT:
        value = body
    else:
        scope = expressions.Scope({"body": body, "headers": call.headers, "query": call.query},
                                  sandbox=core.engine.request_sandbox)
        try:
            value = await scope.evaluate(hook.input)
        except expressions.ExpressionError as exc:
            raise ValidationError.field("input", str(exc)) from None
    if "input_schema" not in (hook.template.spec or {}):
        value = expressions.text_of(value)
    return value


async def accept(core: Shared, hook: WebhookHook, call: Call, *, trace_parent: str | None = None,
                 webhook_id: str | None = None) -> Started:
    """Start the hook's run for a verified call, once per `webhook-id` (24 h);
    `webhook_id`: what `verify` answered already (else it is verified here)."""
    from orchestra.services import runs

    if webhook_id is None:
        webhook_id = verify(core, hook, call)
    if not await may_run(core, hook.template, hook.owner_id):
        raise PermissionDeniedError("The hook's owner may no longer run its template.")
    start = StartKey(scope=f"hook:{hook.id}", key=webhook_id, field="webhook-id")

    async def begin():
        owner = await User.aget_or_none(User.id == hook.owner_id)
        with audit.acting_as(audit.Actor(hook.owner_id, owner.user_name if owner else None, via="hook")):
            return await start_run()

    async def start_run():
        return await runs.start_run(
            core, user_id=hook.owner_id, is_admin=False, template_id=hook.template_id,
            input=await run_input(core, hook, call), template=hook.template,
            trigger={"kind": "webhook", "hook_id": hook.id, "webhook_id": webhook_id},
            remember=start, trace_parent=trace_parent,
        )

    return await run_starts.start_once(core, start, begin, look_first=False)
