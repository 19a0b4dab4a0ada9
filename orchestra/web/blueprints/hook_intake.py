"""`POST /api/v1/hooks/{hook_id}`: the public end of an inbound webhook (SPEC §11).

In this order: the hook (404), the body's size (413 past 1 MiB), the Standard Webhooks
signature (401; nothing is written before it passes), the hook's rate limit (429), then
the run, once per `webhook-id` (services/hooks.py). The hook's limit counts verified
calls only (per hook, so a flood on one hook leaves the others alone); a call that does
not verify counts against its client address instead (`hook_unverified`, 429 past it),
so a flood of unsigned or forged calls cannot use up the hook's limit (SPEC §15b)."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import json

from orchestra.db.database import release_connection
from orchestra.errors import OrchestraError, PayloadTooLargeError
from orchestra.observability import tracing
from orchestra.services import hooks as service
from orchestra.web.apidoc import trigger_models as out
from orchestra.web.apidoc.operation import documented, header
from orchestra.web.limits import client_address
from orchestra.web.responses import SUCCESS

bp = Blueprint("hook_intake", url_prefix="/hooks")


def _call(request: Request) -> service.Call:
    return service.Call(
        body=request.body or b"",
        content_type=request.headers.get("content-type") or "",
        headers={name.lower(): request.headers.get(name) for name in request.headers},
        query={name: values[0] for name, values in request.args.items() if values},
    )


@bp.post("/<hook_id:str>")
@documented(
    "Call an inbound webhook (public; signed per Standard Webhooks)",
    request_content={"application/json": {"schema": {}}, "*/*": {"schema": {}}},
    response=out.HookCall, status=202,
    extra_responses={200: "This webhook-id already started the run named (within 24 hours): "
                          "nothing was started."},
    description="Any body up to 1 MiB (JSON is parsed; anything else is text). The run's "
    "input is the hook's `input` expression over body, headers and query. A call whose "
    "signature does not verify is 401 and leaves nothing behind; a repeated webhook-id "
    "answers the first run's trace_id.",
    errors={400: "BadRequestError: a JSON content type on a body that is not strict JSON.",
            429: "RateLimitedError: the hook's verified calls (ORCHESTRA_RATE_LIMIT_HOOK), or this "
                 "client's calls that did not verify (ORCHESTRA_RATE_LIMIT_HOOK_UNVERIFIED).",
            401: "AuthenticationRequiredError: the signature headers are missing; TokenInvalidError: "
                 "a bad signature, or a timestamp more than 5 minutes away.",
            403: "PermissionDeniedError: the hook's owner may no longer run its template.",
            413: "PayloadTooLargeError: the body is over 1 MiB.",
            422: "ValidationError: the input expression failed on this call (input), or the "
                 "input does not match the template's input_schema."},
    params=(header("webhook-id", "The message id: the same id within 24 hours starts one run."),
            header("webhook-timestamp", "Unix seconds; within 5 minutes of the server's clock."),
            header("webhook-signature", "`v1,<base64 HMAC-SHA256 of id.timestamp.body>` (several "
                   "separated by spaces).")),
)
async def call_hook(request: Request, hook_id: str):
    core = request.app.ctx.core
    limits = request.app.ctx.limits
    hook = await service.find_for_call(core, hook_id)
    await release_connection(core.db)
    if len(request.body or b"") > service.BODY_MAX:
        raise PayloadTooLargeError(f"A webhook's body may be at most {service.BODY_MAX} bytes.")
    call = _call(request)
    try:
        webhook_id = service.verify(core, hook, call)
    except OrchestraError as exc:  # unsigned or forged: counted per client, not per hook
        await limits.hit("hook_unverified", client_address(request))
        raise exc from None
    limit_headers = await limits.hit("hook", hook.id)
    try:
        started = await service.accept(core, hook, call, webhook_id=webhook_id,
                                       trace_parent=tracing.parent_for_run(request.headers))
    except OrchestraError as exc:
        exc.headers = {**limit_headers, **exc.headers}
        raise
    body = {"message": SUCCESS, "trace_id": started.trace_id}
    if started.replayed:
        return json(body, headers={**limit_headers, "Idempotent-Replayed": "true"})
    return json(body, status=202, headers=limit_headers)


call_hook.rate_limit = "hook"  # read by the OpenAPI document (429, RateLimit-* headers)
