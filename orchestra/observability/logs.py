"""Log lines as text or as JSON objects, one a line (`ORCHESTRA_LOG_FORMAT`).

A JSON line has `ts` (UTC, ISO 8601), `level`, `logger`, `msg`, and `request_id` and
`trace_id` (the run's id) when the line was logged for a request or a run; an
exception's traceback goes in `exc`. Sanic's own loggers (server, errors, the access
log) get the same formatter, so a log collector reads one shape. In `json`, so does
everything else the process could write: any other library's records (Python's last-
resort handler), `warnings`, uncaught exceptions (in the main thread and others), and
child processes' stderr (see observability/child_stderr.py).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import UTC, datetime

from orchestra import redaction
from orchestra.observability import context

FORMATS = ("text", "json")
SANIC_LOGGERS = ("sanic.root", "sanic.error", "sanic.access", "sanic.server", "sanic.websockets")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(ids)s: %(message)s"
_ACCESS_FIELDS = ("host", "request", "status", "byte")  # what Sanic's access log adds
_EXTRA_FIELDS = ("child",)  # a child process's stderr line: which child


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
        redaction.scrub_record(record)  # a secret value never reaches a log line (SPEC §14)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
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
        for key in (*_ACCESS_FIELDS, *_EXTRA_FIELDS):
            value = getattr(record, key, None)
            if value not in (None, ""):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:  # a traceback with a secret taken out (redaction.scrub_record)
            line["exc"] = record.exc_text
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
        _everything_else_as_json(formatter, stream)
    else:
        _everything_else_as_python_does()


_LAST_RESORT = logging.lastResort


def _drop_ours(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        if getattr(handler, "_orchestra", False):
            logger.removeHandler(handler)


def _everything_else_as_python_does() -> None:
    """Undo `_everything_else_as_json` (a text configuration after a JSON one)."""
    logging.lastResort = _LAST_RESORT
    logging.captureWarnings(False)
    _drop_ours(logging.getLogger("py.warnings"))
    sys.excepthook = sys.__excepthook__
    threading.excepthook = threading.__excepthook__


def _everything_else_as_json(formatter: logging.Formatter, stream) -> None:
    """Records of loggers with no handler (asyncio, httpx, the mcp SDK …) go to Python's
    last-resort handler, which writes plain text: make it write JSON. `warnings` become
    records; an uncaught exception is logged as one record instead of a printed traceback."""
    # Python's own last resort writes to whatever sys.stderr is when a record comes.
    last_resort = logging.StreamHandler(stream) if stream is not None else logging._StderrHandler()
    last_resort.setLevel(logging.WARNING)
    last_resort.setFormatter(formatter)
    last_resort.addFilter(ContextFilter())
    logging.lastResort = last_resort
    logging.captureWarnings(True)
    py_warnings = logging.getLogger("py.warnings")  # else logging gives it a NullHandler
    _drop_ours(py_warnings)
    last_resort._orchestra = True  # type: ignore[attr-defined]
    py_warnings.addHandler(last_resort)
    crash = logging.getLogger("orchestra.crash")

    def excepthook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            return sys.__excepthook__(kind, value, tb)
        crash.critical("uncaught %s: %s", kind.__name__, value, exc_info=(kind, value, tb))

    def thread_excepthook(args) -> None:
        if args.exc_type is SystemExit:
            return
        crash.error("uncaught %s in thread %s: %s", args.exc_type.__name__,
                    getattr(args.thread, "name", "?"), args.exc_value,
                    exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
