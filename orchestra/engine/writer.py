"""A live run's store writes, applied strictly in order by a task of their own."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from orchestra.engine.log import RunGone


class RunWriter:
    """One live run's store writes (event appends, row updates), applied strictly in the
    order submitted by a task of their own.

    The run submits and goes on, so a step's writes overlap the next provider call; it
    waits only where it must (`await submit(...)`, `drain()`). The first failing write
    (RunGone, a store error) skips every later one; `check()` and `drain()` raise it.
    """

    def __init__(self) -> None:
        # Asked about a failed write: True to try it again (the store is away for a
        # moment: the engine waits with backoff), False to fail the writer.
        self.retry: Callable[[BaseException, int], Awaitable[bool]] | None = None
        # Gives the writing task's pooled connection back. Called after every write: a run
        # streaming without pause would otherwise keep one connection for its whole burst,
        # and a hundred such runs starve requests past the pool's acquire timeout.
        self.release: Callable[[], Awaitable[None]] | None = None
        self._queue: deque[tuple[asyncio.Future, Callable[..., Awaitable], tuple, dict]] = deque()
        self._task: asyncio.Task | None = None
        self.error: BaseException | None = None

    def submit(self, fn: Callable[..., Awaitable], *args: Any, **kwargs: Any) -> asyncio.Future:
        """Queue `await fn(*args, **kwargs)`; the returned future has its result."""
        self.check()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append((future, fn, args, kwargs))
        if self._task is None or self._task.done():
            # A task per burst: pwasyncio gives its pooled connection back when it ends.
            self._task = loop.create_task(self._work())
        return future

    async def _work(self) -> None:
        while self._queue:
            future, fn, args, kwargs = self._queue.popleft()
            result = None
            tries = 0
            while self.error is None:
                try:
                    result = await fn(*args, **kwargs)
                    break
                except Exception as exc:  # noqa: BLE001 - handed to whoever checks next
                    tries += 1
                    if self.retry is not None and await self.retry(exc, tries):
                        continue  # kept, and written when the store is back
                    if self.error is None:
                        self.error = exc
            if self.release is not None:
                await self.release()
            if future.done():  # its waiter went away; the write happened all the same
                continue
            if self.error is not None:
                future.set_exception(self.error)
                future.exception()  # fire-and-forget writes: raised by check()/drain() instead
            else:
                future.set_result(result)

    def abandon(self) -> None:
        """Skip every write not yet applied (the run is held by another process now)."""
        if self.error is None:
            self.error = RunGone("the run is held by another process")

    def check(self) -> None:
        """Raise the error of a failed write, if any."""
        if self.error is not None:
            raise self.error

    async def settle(self) -> None:
        """Wait until every submitted write is done (stored or skipped); never raises."""
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def drain(self) -> None:
        """Wait until every submitted write is stored; raise the first write error."""
        await self.settle()
        self.check()
