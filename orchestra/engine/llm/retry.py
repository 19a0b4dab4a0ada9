"""Retry a provider call with exponential backoff, jitter and `Retry-After`.

Only `LLMError`s marked `retryable` are retried. Retrying is only safe while nothing of
the failed attempt has reached the user: the caller (the engine) must wrap only the
part of a turn that runs before the first token is emitted, or make `attempt_fn` raise
a non-retryable error once it has emitted anything. This helper cannot know.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from orchestra.backoff import Backoff
from orchestra.engine.llm.base import LLMError

T = TypeVar("T")

#: A provider asking for a longer pause than this is treated as asking for this long.
MAX_RETRY_AFTER = 60.0

OnRetry = Callable[[int, LLMError, float], Awaitable[None] | None]


def retry_after_from_headers(headers: Mapping[str, str] | None) -> float | None:
    """Seconds asked for by `retry-after-ms` or `Retry-After` (seconds or HTTP date)."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(float(raw_ms) / 1000, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def backoff_delay(
    retry_number: int, *, base_delay: float, max_delay: float, retry_after: float | None = None
) -> float:
    """Seconds to wait before retry `retry_number` (1-based).

    A provider's `Retry-After` wins (bounded by `MAX_RETRY_AFTER`); otherwise the delay
    doubles each time up to `max_delay`, less the one jitter of orchestra/backoff.py (up
    to a fifth) so that many runs hitting one rate limit do not come back in lock-step.
    """
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, MAX_RETRY_AFTER)
    return Backoff(base=base_delay, cap=max_delay).delay(retry_number)


async def with_retries(
    attempt_fn: Callable[[], Awaitable[T]],
    *,
    attempts: int = 3,
    base_delay: float = 0.5,
    max_delay: float = 8.0,
    on_retry: OnRetry | None = None,
) -> T:
    """Await `attempt_fn()` up to `attempts` times, sleeping between retryable failures.

    `on_retry(retry_number, error, delay)` (sync or async) is called before each sleep,
    e.g. to log or to publish an event. The last error is re-raised unchanged, and a
    non-retryable `LLMError` (or any other exception) is raised at once.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    for attempt in range(1, attempts + 1):
        try:
            return await attempt_fn()
        except LLMError as err:
            if not err.retryable or attempt == attempts:
                raise
            delay = backoff_delay(
                attempt, base_delay=base_delay, max_delay=max_delay, retry_after=err.retry_after
            )
            if on_retry is not None:
                outcome = on_retry(attempt, err, delay)
                if inspect.isawaitable(outcome):
                    await outcome
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
