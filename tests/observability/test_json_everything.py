"""In JSON mode what does not come through orchestra's or Sanic's loggers is JSON too:
another library's record (Python's last-resort handler), a `warnings` warning, and an
uncaught exception; text mode puts Python's own behaviour back."""

from __future__ import annotations

import io
import json
import logging
import sys
import warnings

from orchestra.observability import logs


def test_other_libraries_warnings_and_crashes_are_json_lines():
    buffer = io.StringIO()
    root = logging.getLogger()
    kept, root.handlers = root.handlers, []  # pytest's capture; a server's root has none
    try:
        logs.configure("json", stream=buffer)
        logging.getLogger("some.library").error("a library's own complaint")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("an old way of doing it", DeprecationWarning, stacklevel=1)
        try:
            raise RuntimeError("nobody caught me")
        except RuntimeError:
            sys.excepthook(*sys.exc_info())
    finally:
        root.handlers = kept
        logs.configure("text", stream=io.StringIO())
    records = [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]
    text = " | ".join(r["msg"] for r in records)
    assert "a library's own complaint" in text
    assert "an old way of doing it" in text
    crash = next(r for r in records if "nobody caught me" in r["msg"])
    assert crash["level"] == "CRITICAL" and "RuntimeError" in crash["exc"]
    assert logging.lastResort is logs._LAST_RESORT and sys.excepthook is sys.__excepthook__
