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
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

logger = logging.getLogger("orchestra.child")
LINE_MAX_CHARS = 8192  # a longer line is cut (a child must not fill the log with one record)


class ChildStderr:
    """A pipe to give a child as its stderr: each line it writes is logged as
    `[<name>] <line>` at INFO, and the last few are kept, so that a child that dies at
    start can be reported with its own words (`tail()`)."""

    TAIL_LINES = 10

    def __init__(self, name: str) -> None:
        read_fd, write_fd = os.pipe()
        self.name = name
        self._last: deque[str] = deque(maxlen=self.TAIL_LINES)
        self._reader = threading.Thread(target=self._pump, args=(read_fd,), name=f"stderr-{name}", daemon=True)
        self._reader.start()
        self.file: TextIO = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")

    def _pump(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as pipe:
            for line in pipe:
                text = line.rstrip("\r\n")
                if text.strip():
                    self._last.append(text[:LINE_MAX_CHARS])
                    logger.info("[%s] %s", self.name, text[:LINE_MAX_CHARS], extra={"child": self.name})

    def close(self, wait: float = 0.0) -> None:
        """Close this side; with `wait`, give the reader that long to read what the
        (exited) child left in the pipe."""
        if not self.file.closed:
            self.file.close()
        if wait:
            self._reader.join(wait)

    def tail(self, max_chars: int = 500) -> str:
        """The child's last lines, joined with ' | ', at most `max_chars` (the end kept)."""
        text = " | ".join(self._last)
        return text if len(text) <= max_chars else "…" + text[-max_chars:]


@contextmanager
def stderr_to_log(name: str) -> Iterator[TextIO]:
    """A writable file to give a child as its stderr (see ChildStderr); closed on exit."""
    child = ChildStderr(name)
    try:
        yield child.file
    finally:
        child.close()  # the child's copy closes when it exits; then the reader sees EOF
