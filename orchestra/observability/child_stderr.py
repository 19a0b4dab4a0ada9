"""A child process's stderr as log lines: a pipe whose every line becomes one record of
`orchestra.child` (so with `ORCHESTRA_LOG_FORMAT=json`, one JSON object), instead of
text written straight to the server's own stderr.

Used for stdio MCP servers: the `mcp` SDK hands its `errlog` file to the child as its
stderr. A daemon thread reads the pipe and logs each line with the child's name; it
ends when the child and this side have both closed their ends.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

logger = logging.getLogger("orchestra.child")
LINE_MAX_CHARS = 8192  # a longer line is cut (a child must not fill the log with one record)


@contextmanager
def stderr_to_log(name: str) -> Iterator[TextIO]:
    """A writable file to give a child as its stderr; each line it writes is logged as
    `[<name>] <line>` at INFO. Closed (and the reader left to drain) on exit."""
    read_fd, write_fd = os.pipe()
    reader = threading.Thread(target=_pump, args=(read_fd, name), name=f"stderr-{name}", daemon=True)
    reader.start()
    errlog = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
    try:
        yield errlog
    finally:
        errlog.close()  # the child's copy closes when it exits; then the reader sees EOF


def _pump(read_fd: int, name: str) -> None:
    with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as pipe:
        for line in pipe:
            text = line.rstrip("\r\n")
            if text.strip():
                logger.info("[%s] %s", name, text[:LINE_MAX_CHARS], extra={"child": name})
