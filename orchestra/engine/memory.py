"""Give freed heap memory back to the operating system after a large run.

A run moves megabytes through short-lived strings (prompts, streamed answers, event
frames). CPython frees them, but glibc's allocator keeps the freed pages in its heaps
(and raises its mmap threshold after the first large free, so later large blocks come
from those heaps too): the process's RSS stays at its peak although little is alive
(measured in benchmarks/bench_soak.py: ~6 MB of live Python objects against ~60 MB of
growth). `malloc_trim(0)` returns the free pages; it runs in a thread shortly after a
run ends. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util

_TRIM_EVERY = 1.0
_TRIM_AFTER = 0.2
_handle: asyncio.TimerHandle | None = None
_first = 0.0
_libc = None
try:
    _name = ctypes.util.find_library("c")
    _lib = ctypes.CDLL(_name) if _name else None
    if _lib is not None and hasattr(_lib, "malloc_trim"):
        _libc = _lib
except OSError:  # pragma: no cover - no C library to load
    _libc = None


def trim_now() -> bool:
    """Return free heap pages to the system now; False where that is not possible."""
    if _libc is None:
        return False
    _libc.malloc_trim(0)
    return True


def trim_soon() -> None:
    """Trim in a worker thread shortly (debounced: a burst of run ends trims once,
    after the last of them, and at least once a second while they go on)."""
    global _handle, _first
    if _libc is None:
        return
    loop = asyncio.get_running_loop()
    now = loop.time()
    if _handle is not None:
        _handle.cancel()
    else:
        _first = now
    delay = 0.0 if now - _first >= _TRIM_EVERY else _TRIM_AFTER
    _handle = loop.call_later(delay, _run, loop)


def _run(loop: asyncio.AbstractEventLoop) -> None:
    global _handle
    _handle = None
    loop.run_in_executor(None, trim_now)


def tune_allocator() -> bool:
    """For a long-running server process, before it starts threads: at most two malloc
    arenas (each thread otherwise gets its own heap, which keeps its high-water mark),
    and large blocks (>= 128 KiB: prompts, answers, frames) always from mmap, returned
    to the system when freed (glibc otherwise raises that threshold after the first
    large free). False where this is not glibc."""
    if _libc is None or not hasattr(_libc, "mallopt"):
        return False
    m_mmap_threshold, m_arena_max = -3, -8
    _libc.mallopt(m_arena_max, 2)
    _libc.mallopt(m_mmap_threshold, 128 * 1024)
    return True
