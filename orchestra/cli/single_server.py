"""The embedded SQLite store is served by one process: refuse a second one at start.

Runs, leases and live streams across processes need PostgreSQL's `LISTEN`/`NOTIFY`; on
SQLite one `orchestra serve` process owns the store, so it may resume every unfinished
run at start at once. A second server on the same store (`--workers 2`, or another
`orchestra serve` on the same home by mistake) stops with one clear line instead of
half-working. CLI commands that write to the store (`orchestra user …`) do not take
the lock and keep working while the server runs.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from orchestra.cli.console import ExitCode, fail
from orchestra.settings import Settings

_held: list[int] = []  # the lock's file descriptor, kept open for the life of the process


def sqlite_path(url: str) -> str:
    return url.split("://", 1)[1][1:].split("?", 1)[0]


def hold_sqlite_store(settings: Settings) -> None:
    """Take the store's server lock for this process, or exit with a clear line."""
    path = sqlite_path(settings.database_url)
    if settings.workers > 1:
        fail(
            f"The SQLite store serves one process; --workers {settings.workers} needs "
            "PostgreSQL (ORCHESTRA_DATABASE_URL=postgresql://…, install orchestra[postgres]).",
            ExitCode.USAGE,
        )
    if path == ":memory:" or _held:
        return
    lock_path = Path(path + ".serve.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        fail(
            f"Another orchestra serve (pid {other}) is using the SQLite store {path}. "
            "Stop it first; to run several server processes, use PostgreSQL "
            "(ORCHESTRA_DATABASE_URL=postgresql://…).",
            ExitCode.CONFLICT,
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held.append(fd)
