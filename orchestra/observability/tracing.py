"""OpenTelemetry traces, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and the `otel` extra is installed.

Spans: one per request (`GET /api/v1/workflow/run/{trace_id}`), one per run attempt
(`run`, in whichever process executes it), one per step (`step <id>`), one per model
call (`llm <provider kind>`) and tool call (`tool <name>`). A W3C `traceparent` sent
with `POST /workflow/run` is the request span's parent; the request span's context is
stored with the run (`workflow_run.trace_parent`), and every attempt's `run` span is
its child, so a run taken over by another process stays in the same trace.

With tracing off every function here is a cheap no-op; the exporter and the SDK are
configured the standard way (`OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
`OTEL_BSP_SCHEDULE_DELAY`, …).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("orchestra.tracing")

ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")

_tracer: Any = None  # an opentelemetry Tracer once `setup` ran with an exporter
_provider: Any = None


def wanted() -> bool:
    """Whether the environment asks for traces."""
    return any(os.environ.get(name) for name in ENDPOINT_ENV)


def enabled() -> bool:
    return _tracer is not None


def setup(exporter: Any = None, *, simple: bool = False) -> bool:
    """Start tracing in this process: to `exporter` (tests: an in-memory one), else to the
    OTLP endpoint of the environment. False when not asked for, or the extra is missing."""
    global _tracer, _provider
    if _tracer is not None:
        return True
    if exporter is None and not wanted():
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        logger.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the `otel` extra is not installed "
                       "(pip install 'orchestra[otel]'): no traces")
        return False
    if exporter is None:
        exporter = _otlp_exporter()
        if exporter is None:
            return False
    service = os.environ.get("OTEL_SERVICE_NAME") or "orchestra"
    provider = TracerProvider(resource=Resource.create({"service.name": service, "process.pid": os.getpid()}))
    provider.add_span_processor(SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter))
    _provider, _tracer = provider, provider.get_tracer("orchestra")
    return True


def _otlp_exporter() -> Any:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        logger.warning("no OTLP exporter for protocol %r is installed: no traces", protocol)
        return None
    return OTLPSpanExporter()


def shutdown() -> None:
    """Export what is buffered and stop (server shutdown)."""
    global _tracer, _provider
    provider, _tracer, _provider = _provider, None, None
    if provider is not None:
        try:
            provider.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.warning("could not flush the last spans", exc_info=True)


def flush() -> None:
    if _provider is not None:
        _provider.force_flush()


# -- context ------------------------------------------------------------------------------
def _extract(traceparent: str | None) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent} if traceparent else {}
    return TraceContextTextMapPropagator().extract(carrier)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span (None when tracing is off or no span)."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def parent_for_run(headers: Mapping[str, str]) -> str | None:
    """What a new run stores as its trace parent: the request span (tracing on), else the
    client's own `traceparent` when it is well-formed (a process with tracing on that
    runs it later still joins the client's trace)."""
    mine = current_traceparent()
    if mine:
        return mine
    given = (headers.get("traceparent") or "").strip().lower()
    return given if TRACEPARENT.fullmatch(given) else None


# -- request spans ------------------------------------------------------------------------
def begin_request(ctx: Any, method: str, path: str, headers: Mapping[str, str]) -> None:
    if _tracer is None:
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    given = (headers.get("traceparent") or "").strip().lower()
    parent = _extract(given if TRACEPARENT.fullmatch(given) else None)
    span = _tracer.start_span(
        f"{method} {path}", context=parent, kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": method, "url.path": path},
    )
    ctx.otel_span = span
    ctx.otel_token = otel_context.attach(trace.set_span_in_context(span, parent))


def end_request(ctx: Any, route: str, status: int) -> None:
    span = getattr(ctx, "otel_span", None)
    if span is None:
        return
    from opentelemetry import context as otel_context
    from opentelemetry.trace import Status, StatusCode

    ctx.otel_span = None
    method = span.attributes.get("http.request.method", "") if hasattr(span, "attributes") else ""
    span.update_name(f"{method} {route}")
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
    span.end()
    token = getattr(ctx, "otel_token", None)
    ctx.otel_token = None
    if token is not None:
        with contextlib.suppress(Exception):  # answered from another task (a stream): nothing to undo
            otel_context.detach(token)


# -- engine spans -------------------------------------------------------------------------
class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def trace_id(self) -> str | None:
        return None


class _Span:
    def __init__(self, span: Any) -> None:
        self.span = span

    def set_attribute(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def trace_id(self) -> str | None:
        return format(self.span.get_span_context().trace_id, "032x")


NO_SPAN = _NoSpan()


@contextmanager
def span(name: str, *, parent: str | None = None, detached: bool = False,
         attributes: dict[str, Any] | None = None,
         error_outcomes: tuple[type[BaseException], ...] = (Exception,)) -> Iterator[Any]:
    """A span around the block, current inside it: a child of the W3C `parent` when
    given, else of the current span (`detached`: else a new trace). An exception of
    `error_outcomes` marks it failed."""
    if _tracer is None:
        yield NO_SPAN
        return
    from opentelemetry.trace import Status, StatusCode

    context = _extract(parent) if (parent or detached) else None
    with _tracer.start_as_current_span(
        name, context=context, attributes=attributes or {}, record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield _Span(current)
        except error_outcomes as exc:
            current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200]))
            raise


class _Manual:
    """A span started now and ended by `end` (not made current: an async generator's
    body cannot safely attach a context across its yields)."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def set_attribute(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def end(self, error: str | None = None) -> None:
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_status(Status(StatusCode.ERROR, error[:200]))
        self.span.end()


class _NoManual:
    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def end(self, error: str | None = None) -> None:
        pass


def start_span(name: str, attributes: dict[str, Any] | None = None) -> Any:
    """A child of the current span, ended by the caller (`.end(error=None)`)."""
    if _tracer is None:
        return _NoManual()
    return _Manual(_tracer.start_span(name, attributes=attributes or {}))
