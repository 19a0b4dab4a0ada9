"""CEL evaluation (and JSON Schema checks too large for the event loop) off the event
loop, with a deadline and a memory cap (SPEC §15).

The CEL library holds the GIL and its comprehensions (`map`, `filter`, `all`, `exists`,
`exists_one`) are quadratic: `input.map(x, x)` over 16k items took 15 s, and a thread
would not have spared the loop. So an expression that may be heavy runs in a small pool
of worker processes (`cel_worker.py`, started lazily, never forked from the running
loop) that this object owns: past `ORCHESTRA_EXPRESSION_TIMEOUT_MS` the worker is
killed and replaced, and the evaluation raises ExpressionError naming the limit; the
worker's address space is capped (`ORCHESTRA_EXPRESSION_MEMORY_MB`), and its result is
bounded (`ORCHESTRA_EXPRESSION_RESULT_MAX_BYTES`). A JSON Schema check whose cost
(`schemas.INLINE_CHECK`) is too much for the loop runs here too, under
`ORCHESTRA_SCHEMA_TIMEOUT_MS`.

Workers are plain `python -m` child processes spoken to over their pipes (length-
prefixed JSON), not `multiprocessing`: no fork of a running loop, no re-import of the
parent's `__main__` (pytest-xdist's or a console script's), and asyncio owns the pipes,
so waiting for an answer costs no thread. A worker exits by itself when its stdin
closes, so even a killed parent leaves none behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import sys
from dataclasses import dataclass
from typing import Any

from orchestra.language.expressions import ExpressionError

logger = logging.getLogger("orchestra.engine")

_HEAD = struct.Struct(">I")
START_SECONDS = 30.0  # a worker's start (interpreter, imports) is not the expression's time


@dataclass(frozen=True, slots=True)
class Bounds:
    """The limits of one evaluation (defaults: the settings' defaults)."""

    timeout_ms: int = 1000
    memory_mb: int = 512
    input_max_bytes: int = 4 * 1024 * 1024
    result_max_bytes: int = 4 * 1024 * 1024
    workers: int = 2
    schema_timeout_ms: int = 1000

    @classmethod
    def from_settings(cls, settings: Any) -> Bounds:
        return cls(
            timeout_ms=settings.expression_timeout_ms,
            memory_mb=settings.expression_memory_mb,
            input_max_bytes=settings.expression_input_max_bytes,
            result_max_bytes=settings.expression_result_max_bytes,
            workers=settings.expression_workers,
            schema_timeout_ms=settings.schema_timeout_ms,
        )


class _WorkerGone(Exception):
    """The worker process ended while evaluating (out of memory, killed)."""


class _Worker:
    """One child process evaluating one expression at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, memory_mb: int) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "orchestra.language.cel_worker", str(memory_mb),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        worker = cls(process)
        try:
            async with asyncio.timeout(START_SECONDS):
                ready = await process.stdout.readexactly(1)
        except BaseException:
            await worker.kill()
            raise
        if ready != b"R":
            await worker.kill()
            raise RuntimeError("the expression worker did not start")
        return worker

    async def ask(self, payload: bytes) -> dict[str, Any]:
        try:
            self.process.stdin.write(_HEAD.pack(len(payload)) + payload)
            await self.process.stdin.drain()
            size = _HEAD.unpack(await self.process.stdout.readexactly(_HEAD.size))[0]
            return json.loads(await self.process.stdout.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
            raise _WorkerGone() from exc

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self._reap()

    async def close(self) -> None:
        """Ask it to end (stdin closed: it exits), then make sure it has."""
        with contextlib.suppress(Exception):
            self.process.stdin.close()
        try:
            async with asyncio.timeout(1.0):
                await self.process.wait()
        except TimeoutError:
            pass
        await self.kill()

    async def _reap(self) -> None:
        with contextlib.suppress(Exception):
            self.process.stdin.close()
        with contextlib.suppress(Exception):
            await self.process.wait()
        # Close the pipes' transports now, not at garbage collection (ResourceWarning).
        transport = getattr(self.process, "_transport", None)
        if transport is not None:
            transport.close()


class Sandbox:
    """The engine's pool of expression workers: at most `bounds.workers` evaluations at
    once (the rest wait their turn), each bounded in time, memory and result size."""

    def __init__(self, bounds: Bounds | None = None) -> None:
        self.bounds = bounds or Bounds()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._turns: asyncio.Semaphore | None = None

    async def evaluate(self, source: str, values_json: bytes) -> Any:
        """The JSON value of `source` over the variables `values_json` (a JSON object)."""
        payload = b"".join((b'{"source":', json.dumps(source).encode(), b',"max":',
                            str(self.bounds.result_max_bytes).encode(), b',"values":',
                            values_json, b"}"))
        try:
            answer = await self._ask(payload, self.bounds.timeout_ms)
        except TimeoutError:
            raise ExpressionError(source, (
                f"took longer than {self.bounds.timeout_ms} ms, the limit "
                "(ORCHESTRA_EXPRESSION_TIMEOUT_MS)")) from None
        except _WorkerGone:
            raise ExpressionError(source, (
                f"needed more than {self.bounds.memory_mb} MiB of memory, the limit "
                "(ORCHESTRA_EXPRESSION_MEMORY_MB)")) from None
        if "error" in answer:
            raise ExpressionError(source, answer["error"])
        return answer.get("value")

    async def violations(self, schema_json: str, value: Any, root: str) -> list[dict[str, str]]:
        """`schemas.violations` of a check too large for the event loop; past the deadline
        (or the memory cap) one violation naming the limit."""
        payload = json.dumps({"schema": schema_json, "value": value, "root": root},
                             ensure_ascii=False, separators=(",", ":")).encode()
        try:
            answer = await self._ask(payload, self.bounds.schema_timeout_ms)
        except TimeoutError:
            problem = (f"could not be checked against the schema within {self.bounds.schema_timeout_ms} "
                       "ms, the limit (ORCHESTRA_SCHEMA_TIMEOUT_MS)")
            return [{"field": root or "value", "problem": problem}]
        except _WorkerGone:
            problem = (f"could not be checked against the schema within {self.bounds.memory_mb} MiB "
                       "of memory, the limit (ORCHESTRA_EXPRESSION_MEMORY_MB)")
            return [{"field": root or "value", "problem": problem}]
        return answer.get("value") or []

    async def _ask(self, payload: bytes, timeout_ms: int) -> dict[str, Any]:
        """One request to a free worker, within `timeout_ms`: TimeoutError past it,
        _WorkerGone if the worker died; either way that worker is killed, never reused."""
        if self._turns is None:
            self._turns = asyncio.Semaphore(max(1, self.bounds.workers))
        async with self._turns:
            worker = self._idle.pop() if self._idle else await _Worker.start(self.bounds.memory_mb)
            self._busy.add(worker)
            healthy = False
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    answer = await worker.ask(payload)
                healthy = True
                return answer
            finally:
                self._busy.discard(worker)
                if healthy:
                    self._idle.append(worker)
                else:  # mid-evaluation (deadline, cancelled) or dead: never reused
                    await asyncio.shield(worker.kill())

    async def close(self) -> None:
        """End every worker (the engine's and the app's shutdown)."""
        workers, self._idle = [*self._idle, *self._busy], []
        self._busy.clear()
        await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
