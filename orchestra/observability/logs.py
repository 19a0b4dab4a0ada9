"""Log lines as text or as JSON objects, one a line (`ORCHESTRA_LOG_FORMAT`).

A JSON line has `ts` (UTC, ISO 8601), `level`, `logger`, `msg`, and `request_id` and
`trace_id` (the run's id) when the line was logged for a request or a run; an
exception's traceback goes in `exc`. Sanic's own loggers (server, errors, the access
log) get the same formatter, so a log collector reads one shape.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

from orchestra.observability import context

FORMATS = ("text", "json")
SANIC_LOGGERS = ("sanic.root", "sanic.error", "sanic.access", "sanic.server", "sanic.websockets")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(ids)s: %(message)s"
_ACCESS_FIELDS = ("host", "request", "status", "byte")  # what Sanic's access log adds


class ContextFilter(logging.Filter):
    """Stamp each record with the request and run ids of the task that logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = context.request_id.get()
        if not hasattr(record, "trace_id"):
            record.trace_id = context.run_id.get()
        ids = []
        if record.request_id:
            ids.append(f"request_id={record.request_id}")
        if record.trace_id:
            ids.append(f"trace_id={record.trace_id}")
        record.ids = f" [{' '.join(ids)}]" if ids else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if not line["msg"] and getattr(record, "request", None):  # Sanic's access log: all in extras
            line["msg"] = f"{record.request} {getattr(record, 'status', '')}".strip()
        for key in ("request_id", "trace_id"):
            value = getattr(record, key, None)
            if value:
                line[key] = value
        for key in _ACCESS_FIELDS:
            value = getattr(record, key, None)
            if value not in (None, ""):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.stack_info:
            line["exc"] = record.stack_info
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter_for(kind: str) -> logging.Formatter:
    if kind not in FORMATS:
        raise ValueError(f"ORCHESTRA_LOG_FORMAT must be one of {', '.join(FORMATS)}, got {kind!r}")
    return JsonFormatter() if kind == "json" else logging.Formatter(TEXT_FORMAT)


def configure(kind: str = "text", *, stream=None) -> None:
    """Send orchestra's loggers (INFO and up) to stderr in `kind`; in `json`, Sanic's
    loggers too. Safe to call again (a test app, a second app in one process): the
    handler this installed before is replaced, nothing is added twice."""
    formatter = formatter_for(kind)
    root = logging.getLogger("orchestra")
    for handler in list(root.handlers):
        if getattr(handler, "_orchestra", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._orchestra = True  # type: ignore[attr-defined]
    handler.setFormatter(formatter)
    handler.addFilter(ContextFilter())
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    root.propagate = False
    if kind == "json":
        for name in SANIC_LOGGERS:
            for sanic_handler in logging.getLogger(name).handlers:
                sanic_handler.setFormatter(formatter)
                if not any(isinstance(f, ContextFilter) for f in sanic_handler.filters):
                    sanic_handler.addFilter(ContextFilter())
