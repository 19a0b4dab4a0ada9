"""`create_app(settings)`: the Sanic application. Nothing is created at import time."""

from __future__ import annotations

import itertools
import logging
import re

from sanic import Sanic
from sanic_ext import Config
from sanic_ext.extensions.http.extension import HTTPExtension

from orchestra.db.database import end_task_store_work, release_connection
from orchestra.process import Process
from orchestra.settings import Settings
from orchestra.web import errors, head, observe
from orchestra.web.apidoc import ui as apidoc_ui
from orchestra.web.blueprints import all_blueprints, mcp_endpoint
from orchestra.web.limits import RateLimits
from orchestra.web.mcp_host import McpHost
from orchestra.web.protocol import HEAD_MAX_BYTES

_app_numbers = itertools.count(1)


class OrchestraSanic(Sanic):
    """Sanic, plus one guarantee: whatever a request does (answers, fails, streams,
    is cancelled by a client hanging up), its store connection goes back to the pool
    and any transaction it left open is rolled back when the request ends."""

    async def handle_request(self, request) -> None:
        # The request's id, clock and span, before anything can log: here rather than in
        # a request middleware, which costs Sanic a middleware pass on every request.
        observe.begin(request)
        try:
            await super().handle_request(request)
        finally:
            core = getattr(self.ctx, "core", None)
            if core is not None:
                await end_task_store_work(core.db)

    async def _startup(self) -> None:
        # Every route is known by now: add HEAD and OPTIONS before Sanic compiles the
        # router, so that it is compiled once (web/head.py).
        head.add_method_routes(self)
        await super()._startup()

_SECRET_QUERY = re.compile(r"(access_token=)[^&\s\"]+")


class _RedactTokens(logging.Filter):
    """Keep `?access_token=` (SSE from a browser) out of every log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "access_token=" in record.msg:
            record.msg = _SECRET_QUERY.sub(r"\1[redacted]", record.msg)
        for key in ("request", "host"):
            value = getattr(record, key, None)
            if isinstance(value, str) and "access_token=" in value:
                setattr(record, key, _SECRET_QUERY.sub(r"\1[redacted]", value))
        return True


def _install_log_redaction() -> None:
    for name in ("sanic.access", "sanic.root", "sanic.error", "orchestra"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactTokens) for f in logger.filters):
            logger.addFilter(_RedactTokens())


def create_app(settings: Settings | None = None, *, name: str | None = None) -> Sanic:
    """Build the app for `settings`; the store opens when the server starts."""
    settings = settings or Settings.from_env()
    app = OrchestraSanic(name or f"orchestra_{next(_app_numbers)}", request_class=head.OrchestraRequest)
    app.config.REQUEST_MAX_SIZE = settings.request_max_bytes
    app.config.REQUEST_MAX_HEADER_SIZE = HEAD_MAX_BYTES
    app.config.ACCESS_LOG = settings.access_log
    app.config.FALLBACK_ERROR_FORMAT = "json"
    # A handler silent this long (no byte in or out) is cancelled: 503 OverloadedError.
    app.config.RESPONSE_TIMEOUT = settings.response_timeout
    app.config.REQUEST_TIMEOUT = 60
    app.config.KEEP_ALIVE_TIMEOUT = 15
    # On SIGTERM the engine's grace comes first (before_server_stop); then open
    # connections (streams) get this long before they are closed: exit ≤ grace + 5 s.
    app.config.GRACEFUL_SHUTDOWN_TIMEOUT = 2.0
    app.config.MOTD = False
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    # Only sanic-ext's HTTP extension (CORS). Its other built-ins are unused here, and the
    # injection one dispatched a Sanic signal on every request (~5 % of a small request's
    # CPU) to inject nothing.
    app.extend(
        built_in_extensions=False,
        extensions=[HTTPExtension],
        config=Config(
            oas=False,  # the document and its pages are orchestra.web.apidoc (OpenAPI 3.1)
            cors=bool(origins),
            cors_origins=",".join(origins) if origins else "",
            cors_expose_headers="Retry-After,RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset",
            health=False,
            http_auto_head=False,  # ours: orchestra.web.head
            # OPTIONS is ours too, added with HEAD before the router is compiled. sanic-ext's
            # CORS insists on its own being on; it then finds every path answered already.
            http_auto_options=bool(origins),
            http_auto_trace=False,
        )
    )
    app.ctx.settings = settings
    api = all_blueprints()
    pages = [apidoc_ui.bp, mcp_endpoint.bp]
    if settings.console:
        from orchestra.web.blueprints import console

        pages.append(console.bp)
    # Blueprints are module-level objects, and Sanic keeps on each one every app it joined
    # and those apps' routes (and re-registers on all of them): forget the earlier apps,
    # so that an app built after hundreds of others (a test suite) costs and holds what
    # the first one did.
    for blueprint in [*api.blueprints, *pages]:
        blueprint.reset()
    app.blueprint([api, *pages])
    errors.install(app)
    observe.install(app)  # GET /metrics (request ids, metrics, spans: begin and end)

    @app.on_response(priority=1000)
    async def end(request, response) -> None:
        """One response middleware for every answer (a handler's, an error's, a stream's
        head): `X-Request-ID`, the request's metrics and span (web/observe.py); then the
        store connection goes back before the response is written (for a stream: before
        it starts; `OrchestraSanic.handle_request` releases again at its end)."""
        observe.end(request, response)
        core = getattr(app.ctx, "core", None)
        if core is not None:
            await release_connection(core.db)
    _install_log_redaction()

    # The process's parts (store, engine, loops, MCP host) belong to its owner
    # (orchestra/process.py); the app only calls it from Sanic's listeners.
    @app.before_server_start
    async def start_process(app: Sanic) -> None:
        app.ctx.limits = RateLimits(settings)
        process = await Process.open(settings, mcp_host=McpHost)
        app.ctx.process, app.ctx.core, app.ctx.mcp = process, process.core, process.mcp
        await process.start()

    @app.before_server_stop
    async def stop_process(app: Sanic) -> None:
        # The loops, the MCP host, then the engine's grace and hand-back: before streams
        # are closed (GRACEFUL_SHUTDOWN_TIMEOUT, above).
        await app.ctx.process.stop()

    @app.after_server_stop
    async def close_process(app: Sanic) -> None:
        await app.ctx.process.close()  # the store last; the last spans flushed

    return app
