"""A live run's store writes, applied strictly in order by a task of their own."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from orchestra.engine.store.events import RunGone

GROUP_LIMIT = 100  # writes applied together at most: a transaction stays short
_SINGLE = object()  # the queue entry of a plain `submit`


class RunWriter:
    """One live run's store writes (event appends, row updates), applied strictly in the
    order submitted by a task of their own.

    The run submits and goes on, so a step's writes overlap the next provider call; it
    waits only where it must (`await submit(...)`, `drain()`). The first failing write
    (RunGone, a store error) skips every later one; `check()` and `drain()` raise it.

    Group commit: writes submitted with `submit_many` that wait next to each other in the
    queue (twenty parallel steps starting at once, or ending while an earlier write is in
    flight) are applied by one call of their function, in one transaction: the run pays
    one commit, and other processes one notification, for the whole group.
    """

    def __init__(self, *, retry: Callable[[BaseException, int], Awaitable[bool]] | None = None,
                 release: Callable[[], Awaitable[None]] | None = None) -> None:
        # Asked about a failed write: True to try it again (the store is away for a
        # moment: the engine waits with backoff), False to fail the writer.
        self.retry = retry
        # Gives the writing task's pooled connection back. Called after every write: a run
        # streaming without pause would otherwise keep one connection for its whole burst,
        # and a hundred such runs starve requests past the pool's acquire timeout.
        self.release = release
        # (future, fn, args, kwargs, item): `item` is _SINGLE for `submit`, else one of a
        # group `fn([item, ...], *args)` applies together.
        self._queue: deque[tuple[asyncio.Future, Callable[..., Awaitable], tuple, dict, Any]] = deque()
        self._task: asyncio.Task | None = None
        self.error: BaseException | None = None

    def submit(self, fn: Callable[..., Awaitable], *args: Any, **kwargs: Any) -> asyncio.Future:
        """Queue `await fn(*args, **kwargs)`; the returned future has its result."""
        return self._enqueue(fn, args, kwargs, _SINGLE)

    def submit_many(self, fn: Callable[..., Awaitable], item: Any, *args: Any) -> asyncio.Future:
        """Queue `item` for `await fn([item, ...], *args)`, applied together with the items
        queued right before or after it for the same `fn` and `args`; the returned future
        is done (result None) once the group is stored."""
        return self._enqueue(fn, args, {}, item)

    def _enqueue(self, fn: Callable[..., Awaitable], args: tuple, kwargs: dict, item: Any) -> asyncio.Future:
        self.check()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append((future, fn, args, kwargs, item))
        if self._task is None or self._task.done():
            # A task per burst: pwasyncio gives its pooled connection back when it ends.
            self._task = loop.create_task(self._work())
        return future

    def _next_group(self) -> tuple[list[asyncio.Future], Callable[..., Awaitable], tuple, dict, bool]:
        """The next queued write: one `submit`, or the run of `submit_many` items that wait
        together for the same function (applied as one call)."""
        future, fn, args, kwargs, item = self._queue.popleft()
        if item is _SINGLE:
            return [future], fn, args, kwargs, False
        futures, items = [future], [item]
        queue = self._queue
        while queue and len(items) < GROUP_LIMIT:
            _, next_fn, next_args, _, next_item = queue[0]
            if next_item is _SINGLE or next_fn != fn or next_args != args:
                break
            futures.append(queue.popleft()[0])
            items.append(next_item)
        return futures, fn, (items, *args), kwargs, True

    async def _work(self) -> None:
        while self._queue:
            futures, fn, args, kwargs, grouped = self._next_group()
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
            if grouped:
                result = None
            for future in futures:
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
