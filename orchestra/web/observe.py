"""The web side of observability: `X-Request-ID` on every response, a count and a
duration per request (by route template), a span per request when tracing is on, and
`GET /metrics` when `ORCHESTRA_METRICS` is on.

`begin` runs first thing in `OrchestraSanic.handle_request`; `end` in the app's one
response middleware: Sanic runs response middleware for every answer — a handler's, an
error's (404 for an unknown path too, or a head refused before any handler), and a
stream's head (`request.respond`) — so `end` is the one place that stamps and counts
them. Both run on every request, so they keep to the cheap path: a route's template is
worked out once, a label set's metric children are looked up once (metrics.http_request).
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from datetime import datetime, timedelta

from peewee import fn
from sanic import Blueprint, Request, Sanic
from sanic.response import raw

from orchestra.db.database import release_connection
from orchestra.db.models import WorkflowRun, utcnow
from orchestra.errors import AuthenticationRequiredError, TokenInvalidError
from orchestra.observability import context, metrics, tracing
from orchestra.services import audit
from orchestra.services.workspace_rights import bind_key_reach
from orchestra.vocabulary import RunStatus

_PARAM = re.compile(r"<([^:>]+)(?::[^>]*)?>")
STORE_GAUGES_TIMEOUT = 2.0  # seconds a scrape waits for the store-wide gauges
UNMATCHED = "unmatched"  # the route label of a request that matched no route (a 404)


_templates: dict[str, str] = {}  # a route's path -> its label (a few dozen routes)


def route_template(request: Request) -> str:
    """`/api/v1/workflow/run/{trace_id}` for the route that matched; never a raw id."""
    route = getattr(request, "route", None)
    if route is None:
        return UNMATCHED
    template = _templates.get(route.path)
    if template is None:
        template = _templates[route.path] = "/" + _PARAM.sub(r"{\1}", route.path).lstrip("/")
    return template


def install(app: Sanic) -> None:
    """`GET /metrics` when ORCHESTRA_METRICS is on (`begin` and `end` are called by the
    app for every request, see web/app.py)."""
    settings = app.ctx.settings
    if settings.metrics:
        app.blueprint(metrics_blueprint(settings.metrics_token))


def begin(request: Request) -> None:
    """A request's start: its clock, its id (the client's when sane) in the logging
    context, and its span when tracing is on."""
    ctx = request.ctx
    ctx.started = time.perf_counter()
    ctx.request_id = request_id = context.sane_request_id(
        request.headers.get(context.REQUEST_ID_HEADER))
    context.request_id.set(request_id)
    context.run_id.set(None)
    # who acts is bound once the request is authenticated (web/auth.py); until then no one
    audit.bind(None, request.remote_addr or request.ip or None)
    bind_key_reach(None)  # and no API key's workspace narrows it (web/auth.py binds one)
    tracing.begin_request(ctx, request.method, request.path, request.headers)


def end(request: Request, response) -> None:
    """An answer's head is about to go: stamp `X-Request-ID`; count and time the request
    and end its span, once (a stream's head and then its error are one request)."""
    if response is None:
        return
    ctx = request.ctx
    if not hasattr(ctx, "request_id"):  # refused before handle_request began (a bad head)
        begin(request)
    response.headers[context.REQUEST_ID_HEADER] = ctx.request_id
    if getattr(ctx, "observed", False):
        return
    ctx.observed = True
    route = route_template(request)
    metrics.http_request(request.method, route, response.status, time.perf_counter() - ctx.started)
    tracing.end_request(ctx, route, response.status)


def metrics_blueprint(token: str) -> Blueprint:
    bp = Blueprint("metrics")

    @bp.get("/metrics")
    async def scrape(request: Request):
        if token:
            _check_token(request, token)
        gauges = None
        core = getattr(request.app.ctx, "core", None)
        if core is not None:
            try:  # a scrape answers during a store outage too: without the store's gauges
                async with asyncio.timeout(STORE_GAUGES_TIMEOUT):
                    gauges = await _store_gauges(core)
            except Exception:  # noqa: BLE001 - the outage shows in orchestra_store_down
                metrics.store_unavailable()
            else:
                metrics.store_available()
        return raw(metrics.exposition(gauges), content_type=metrics.CONTENT_TYPE,
                   headers={"Cache-Control": "no-store"})

    return bp


def _check_token(request: Request, token: str) -> None:
    header = request.headers.get("authorization")
    if not header:
        raise AuthenticationRequiredError(
            "GET /metrics needs 'Authorization: Bearer <ORCHESTRA_METRICS_TOKEN>'.",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise TokenInvalidError(
            "The metrics token is not valid.", headers={"WWW-Authenticate": 'Bearer realm="metrics"'}
        )


async def _store_gauges(core) -> metrics.StoreGauges:
    """How many runs wait to be claimed, and how long the oldest has waited."""
    query = WorkflowRun.select(fn.COUNT(WorkflowRun.trace_id), fn.MIN(WorkflowRun.created_at)).where(
        WorkflowRun.status == RunStatus.QUEUED)
    try:
        rows = await core.db.list(query.tuples())
    finally:
        await release_connection(core.db)
    count, oldest = rows[0] if rows else (0, None)
    age = 0.0
    if oldest is not None:
        if isinstance(oldest, str):  # SQLite hands back text for an aggregate
            oldest = datetime.fromisoformat(oldest)
        now = utcnow()
        if oldest.tzinfo is None and now.tzinfo is not None:
            now = now.replace(tzinfo=None)
        age = max((now - oldest) / timedelta(seconds=1), 0.0)
    return metrics.StoreGauges(int(count or 0), age)
