"""The sandbox code steps run in (SPEC §17): pydantic-monty, a subset of Python written in
Rust for untrusted code, run in a pool of `monty` worker processes this object owns.

Why this interpreter: it has no filesystem, network, environment or subprocess unless
the host hands them in (we hand in none: `open` and `os` answer PermissionError, an
import outside its few modules fails), it enforces the bounds itself inside the worker
— time (`max_feed_duration_secs`), heap (`max_memory`) and call depth — and the pool
kills and replaces a worker that does not stop (`request_timeout`), so neither a
`while True` nor a 10 GB list reaches the server's process. A call costs a fraction of
a millisecond warm (a checkout, one feed over the worker's pipe). CPython's `exec` is
never used, nor a `python` subprocess.

What a run is given: `input`, `steps`, and inside a foreach `item` and `index` (each
converted once, as globals); a clock frozen at the instance's stored start (UTC), so a
resume computes the same value; `sleep` that returns at once; `re` bound to
code_re.py (the no-backtracking engine) by rewriting the source's `import re` on its
own line. `print` goes nowhere. The output is the value of the last expression,
converted to JSON (tuples become lists; a value JSON cannot hold fails naming its type).
"""

from __future__ import annotations

import ast
import asyncio
import datetime as dt
import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import pydantic_monty as monty

from orchestra.engine import code_re

RE_MODULE = "orchestra_re"
_FROM_RE = re.compile(r"from\s+re\b")
_GRACE_SECONDS = 2.0  # past the time bound, the pool kills the worker that did not stop itself


class CodeError(Exception):
    """A code step's run failed: `message` reads `ValueError: … (line 5)` or names a bound."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class CodeBounds:
    timeout_ms: int = 1000
    memory_mb: int = 64
    recursion_max: int = 200
    workers: int = 2

    @classmethod
    def from_settings(cls, settings: Any) -> CodeBounds:
        return cls(settings.code_timeout_ms, settings.code_memory_mb, settings.code_recursion_max,
                   settings.code_workers)


class CodeSandbox:
    """The worker pool (started at the first code step) and one run in it."""

    def __init__(self, bounds: CodeBounds) -> None:
        self.bounds = bounds
        self._pool: monty.AsyncMonty | None = None
        self._starting = asyncio.Lock()

    async def _started(self) -> monty.AsyncMonty:
        async with self._starting:
            if self._pool is None:
                pool = monty.AsyncMonty(
                    min_processes=1, max_processes=self.bounds.workers,
                    request_timeout=self.bounds.timeout_ms / 1000 + _GRACE_SECONDS,
                    feed_duration_limit_grace=_GRACE_SECONDS / 2)
                await pool.__aenter__()
                self._pool = pool
        return self._pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.__aexit__(None, None, None)

    async def run(self, source: str, variables: dict[str, Any], now: dt.datetime,
                  timeout_seconds: float | None = None) -> Any:
        """The JSON value of `source`'s last expression (None when it ends otherwise);
        CodeError when it raises, passes a bound or gives what JSON cannot hold."""
        bound_s = self.bounds.timeout_ms / 1000
        limit_s, setting = bound_s, f"{self.bounds.timeout_ms} ms (ORCHESTRA_CODE_TIMEOUT_MS)"
        if timeout_seconds is not None and timeout_seconds < bound_s:
            limit_s, setting = timeout_seconds, f"{timeout_seconds:g} s (the step's timeout_seconds)"
        limits: monty.ResourceLimits = {
            "max_feed_duration_secs": limit_s, "max_memory": self.bounds.memory_mb * 1024 * 1024,
            "max_recursion_depth": self.bounds.recursion_max}
        policy: monty.OSPolicy = {"datetime": now.astimezone(dt.UTC), "timezone": "utc", "sleep": "zero",
                                  "random_start": {"seed": 0}}
        pool = await self._started()
        try:
            async with pool.checkout(script_name="code.py", limits=limits, os_policy=policy,
                                     external_modules={RE_MODULE: code_re.module}) as session:
                async with asyncio.timeout(limit_s + _GRACE_SECONDS * 2):  # time in host calls too
                    value = await session.feed_run(bind_re(source), inputs=variables, print_callback=_drop)
        except monty.MontyRuntimeError as exc:
            raise CodeError(self._described(exc, setting)) from None
        except monty.MontySyntaxError as exc:
            raise CodeError(f"SyntaxError: {exc.display('msg')}{_line_of(exc)}") from None
        except monty.MontyCrashedError as exc:
            if exc.timed_out:
                raise CodeError(f"the code ran past its time limit of {setting}") from None
            raise CodeError("the code's worker stopped (it is replaced); the code may have needed "
                            f"more than its limits allow (ORCHESTRA_CODE_MEMORY_MB is {self.bounds.memory_mb})") from None
        except monty.MontyConversionError as exc:
            raise CodeError(f"the step's variables cannot be given to the code: {str(exc)[:200]}") from None
        except TimeoutError:
            raise CodeError(f"the code ran past its time limit of {setting}") from None
        return to_json(value)

    def _described(self, exc: monty.MontyRuntimeError, setting: str) -> str:
        text = exc.display("type-msg").replace(f"'{RE_MODULE}'", "'re'")
        kind = text.partition(":")[0]
        line = _line_of(exc)
        if kind == "TimeoutError" and "time limit exceeded" in text:
            return f"the code ran past its time limit of {setting}{line}"
        if kind == "MemoryError" and "memory limit exceeded" in text:
            return (f"the code needed more memory than its limit of {self.bounds.memory_mb} MiB "
                    f"(ORCHESTRA_CODE_MEMORY_MB){line}")
        if kind == "RecursionError":
            return (f"the code called deeper than its limit of {self.bounds.recursion_max} "
                    f"(ORCHESTRA_CODE_RECURSION_MAX){line}")
        return f"{text[:1000]}{line}"


def _drop(stream: str, text: str) -> None:
    """`print` output: not kept (a step's output is its last expression)."""


def _line_of(exc: Any) -> str:
    frames = exc.traceback()
    return f" (line {frames[-1].line})" if frames else ""


@functools.lru_cache(maxsize=512)
def bind_re(source: str) -> str:
    """`source` with each `import re` / `from re import …` made to import code_re's module
    instead, on the same line (line numbers stay the user's)."""
    if "re" not in source:
        return source
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source  # the sandbox reports it
    lines = source.split("\n")
    edits: list[tuple[int, int, int, str]] = []  # (line index, start, end, text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "re":
                    start = _column(lines[alias.lineno - 1], alias.col_offset)
                    edits.append((alias.lineno - 1, start, start + 2,
                                  RE_MODULE if alias.asname else f"{RE_MODULE} as re"))
        elif isinstance(node, ast.ImportFrom) and node.module == "re" and not node.level:
            line = lines[node.lineno - 1]
            found = _FROM_RE.match(line, _column(line, node.col_offset))
            if found:
                edits.append((node.lineno - 1, found.end() - 2, found.end(), RE_MODULE))
    for index, start, end, text in sorted(edits, reverse=True):
        lines[index] = lines[index][:start] + text + lines[index][end:]
    return "\n".join(lines)


def _column(line: str, byte_offset: int) -> int:
    """ast's column (UTF-8 bytes) as a string index."""
    return len(line.encode()[:byte_offset].decode(errors="ignore"))


def to_json(value: Any, path: str = "output") -> Any:
    """The code's value as JSON: tuples become lists; anything JSON cannot hold fails
    naming its type and where it is."""
    try:
        return _json(value, path)
    except RecursionError:
        raise CodeError("the output is nested too deeply to be stored as JSON") from None


def _json(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CodeError(f"the output holds {value} at {path}, which JSON cannot hold")
        return value
    if isinstance(value, list | tuple):
        return [_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CodeError(f"the output holds a dict key of type {_type(key)} at {path}; "
                                "JSON keys are strings")
            out[key] = _json(item, f"{path}[{key!r}]")
        return out
    raise CodeError(f"the output holds a value of type {_type(value)} at {path}, which JSON cannot hold")


def _type(value: Any) -> str:
    if isinstance(value, monty.MontyClassProxy):
        return value.name
    if isinstance(value, monty.ClassInstance):
        return type(value.value).__name__
    return type(value).__name__
