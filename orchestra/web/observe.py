"""The web side of observability: `X-Request-ID` on every response, a count and a
duration per request (by route template), a span per request when tracing is on, and
`GET /metrics` when `ORCHESTRA_METRICS` is on.

Sanic runs response middleware for every answer — a handler's, an error's (404 for
an unknown path too), and a stream's head (`request.respond`) — so this is the one
place that stamps and counts them.
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

_PARAM = re.compile(r"<([^:>]+)(?::[^>]*)?>")
STORE_GAUGES_TIMEOUT = 2.0  # seconds a scrape waits for the store-wide gauges
UNMATCHED = "unmatched"  # the route label of a request that matched no route (a 404)


def route_template(request: Request) -> str:
    """`/api/v1/workflow/run/{trace_id}` for the route that matched; never a raw id."""
    route = getattr(request, "route", None)
    if route is None:
        return UNMATCHED
    return "/" + _PARAM.sub(r"{\1}", route.path).lstrip("/")


def install(app: Sanic) -> None:
    """Request ids, request metrics and request spans for every request of `app`."""
    settings = app.ctx.settings

    @app.on_request(priority=1000)  # first: later middleware and handlers log with the id
    async def begin(request: Request) -> None:
        _begin(request)

    @app.on_response(priority=1000)
    async def end(request: Request, response) -> None:
        if response is None:
            return
        if not hasattr(request.ctx, "request_id"):  # answered before request middleware ran
            _begin(request)
        response.headers[context.REQUEST_ID_HEADER] = request.ctx.request_id
        if getattr(request.ctx, "observed", False):  # a stream's head, then its error: once
            return
        request.ctx.observed = True
        route = route_template(request)
        metrics.http_request(request.method, route, response.status,
                             time.perf_counter() - request.ctx.started)
        tracing.end_request(request.ctx, route, response.status)

    if settings.metrics:
        app.blueprint(metrics_blueprint(settings.metrics_token))


def _begin(request: Request) -> None:
    request.ctx.started = time.perf_counter()
    request.ctx.request_id = context.sane_request_id(request.headers.get(context.REQUEST_ID_HEADER))
    context.request_id.set(request.ctx.request_id)
    context.run_id.set(None)
    tracing.begin_request(request.ctx, request.method, request.path, request.headers)


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
        WorkflowRun.status == "queued")
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
