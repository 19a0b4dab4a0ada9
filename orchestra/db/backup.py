"""A consistent copy of a SQLite store while a server writes to it (`orchestra db backup`).

SQLite's online backup API copies the database page by page from inside one read
transaction (all pages in one step), so the copy is the store as it was at one instant,
whatever is committed meanwhile; in WAL mode that read blocks no writer. The copy is
written to a temporary file beside the target, checked (`PRAGMA quick_check`), then
renamed into place, so a failed or interrupted backup never leaves a half-written file
under the target's name. PostgreSQL has its own tools (pg_dump), which this does not
replace.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path


class BackupError(Exception):
    """The copy could not be made; the message says why in one sentence."""


def backup_sqlite(source: Path, target: Path, *, busy_timeout_ms: int = 10_000) -> int:
    """Copy the SQLite database at `source` to `target` (which must not exist); the
    copy's size in bytes."""
    if not source.is_file():
        raise BackupError(f"there is no SQLite store at {source}")
    if target.exists():
        raise BackupError(f"{target} already exists; name a new file (or remove it first)")
    if not target.parent.is_dir():
        raise BackupError(f"the folder {target.parent} does not exist")
    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        src = sqlite3.connect(source, timeout=busy_timeout_ms / 1000)
        try:
            dst = sqlite3.connect(temporary)
            try:
                src.backup(dst, pages=-1)
                verdict = dst.execute("PRAGMA quick_check").fetchone()[0]
                if verdict != "ok":
                    raise BackupError(f"the copy failed its integrity check: {verdict}")
                dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(temporary, target)
    except sqlite3.Error as exc:
        raise BackupError(f"could not copy {source}: {exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return target.stat().st_size
