"""Token deltas of one step, batched into one `token` event per interval (~50 ms)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class TokenCoalescer:
    """Collect token deltas of one step and append them as one `token` event per interval."""

    def __init__(
        self, emit: Callable[[str], Awaitable[Any]], *, interval: float = 0.05
    ) -> None:
        self._emit = emit
        self.interval = interval
        self._buffer: list[str] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task | None = None
        self._sleeping_timer: asyncio.Task | None = None
        self._error: Exception | None = None

    def add(self, text: str) -> None:
        if not text:
            return
        self._buffer.append(text)
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._later())
            self._sleeping_timer = self._timer

    async def _later(self) -> None:
        await asyncio.sleep(self.interval)
        self._sleeping_timer = None
        try:
            await self._flush()
        except Exception as exc:  # noqa: BLE001 - re-raised by the next flush()
            self._error = exc

    async def flush(self) -> None:
        """Append whatever is buffered now (call before any other event of the step)."""
        await self._stop_timer()
        await self._flush()

    async def take(self) -> str:
        """Stop the timer and hand back the buffered text un-appended: the caller stores it
        together with the step's next event (one statement instead of two)."""
        await self._stop_timer()
        async with self._lock:
            text = "".join(self._buffer)
            self._buffer.clear()
        return text

    async def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            if self._sleeping_timer is timer:  # still sleeping: cancel it, we flush now
                timer.cancel()
            else:  # already flushing: let that append finish first, in order
                await asyncio.shield(timer)
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    async def _flush(self) -> None:
        async with self._lock:
            if not self._buffer:
                return
            text = "".join(self._buffer)
            self._buffer.clear()
            await self._emit(text)

    async def close(self) -> None:
        """Stop the timer without emitting (the step was cancelled)."""
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            timer.cancel()
        self._buffer.clear()
