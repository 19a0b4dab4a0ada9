"""Exponential backoff for the internal retries: one rule and one jitter for every loop
that tries again after a failure (a store outage, a lost seq race, the LISTEN
connection, a provider's error, a webhook delivery, the CLI's event stream).

The delay before retry `attempt` (1, 2, …) is `base` doubled per retry up to `cap`, less
a jitter of up to a fifth (between 80 % and all of it): many processes or runs that failed
together do not come back in lock-step, no wait passes the cap, and each wait is longer
than the one before it. (A step's own `retry` policy is the user's rule, SPEC §7: language/policies.py.)
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

JITTER = 0.2  # the share of a delay drawn at random
_DOUBLINGS_MAX = 64  # past it every delay is the cap (and 2 ** n stays a float)


@dataclass(frozen=True, slots=True)
class Backoff:
    """A schedule of delays: `base` seconds doubled per retry, at most `cap`."""

    base: float
    cap: float

    def ceiling(self, attempt: int) -> float:
        """The delay before retry `attempt` before jitter: `base * 2 ** (attempt - 1)`, capped."""
        doublings = min(max(attempt, 1) - 1, _DOUBLINGS_MAX)
        return min(self.cap, self.base * 2.0 ** doublings)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry `attempt` (1-based): between 80 % of the ceiling and it."""
        return self.ceiling(attempt) * random.uniform(1.0 - JITTER, 1.0)

    async def sleep(self, attempt: int) -> None:
        await asyncio.sleep(self.delay(attempt))
