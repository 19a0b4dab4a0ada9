"""Argon2id hashing in a bounded thread pool, never on the event loop.

At most `concurrency` hashes run at once (one per core by default); up to `queue`
more may wait. Past that the caller gets OverloadedError (503) at once, so a
login flood cannot grow latency and memory without bound. On Linux the hashing
threads run at a lower CPU priority (nice +10): a flood of logins keeps every core
busy hashing, and without this the event loop waits for its turn behind them, so
every other request gets tens of milliseconds slower.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from orchestra.errors import OverloadedError
from orchestra.observability import metrics

HASH_NICENESS = 10


def _lower_priority() -> None:
    """Run in each hashing thread: on Linux, niceness is per thread (and inherited by
    the threads argon2 itself starts for its lanes)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        thread = threading.get_native_id()
        niceness = min(19, os.getpriority(os.PRIO_PROCESS, thread) + HASH_NICENESS)
        os.setpriority(os.PRIO_PROCESS, thread, niceness)
    except OSError:  # not permitted here: hash at normal priority
        pass


class PasswordService:
    def __init__(
        self,
        *,
        time_cost: int,
        memory_cost: int,
        parallelism: int,
        concurrency: int = 0,
        queue: int = 64,
    ) -> None:
        self._hasher = PasswordHasher(
            time_cost=time_cost,
            memory_cost=memory_cost,
            parallelism=parallelism,
            type=Type.ID,
        )
        self.concurrency = concurrency or os.cpu_count() or 1
        self._executor = ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="argon2", initializer=_lower_priority
        )
        self._capacity = self.concurrency + max(queue, 0)
        self._in_flight = 0

    def ensure_capacity(self) -> None:
        """OverloadedError now when a hash could not even queue: lets a caller refuse a
        request before doing any other work for it (a login flood costs little)."""
        if self._in_flight >= self._capacity:
            raise OverloadedError(
                "Too many password checks are waiting; try again shortly.",
                headers={"Retry-After": "1"},
            )

    async def _offload(self, fn, *args):
        self.ensure_capacity()
        self._in_flight += 1
        metrics.password_hashes(1)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._in_flight -= 1
            metrics.password_hashes(-1)

    async def hash(self, password: str) -> str:
        """A salted argon2id hash of `password`."""
        return await self._offload(self._hasher.hash, password)

    async def verify(self, stored_hash: str, password: str) -> bool:
        """True when `password` matches `stored_hash`; False on mismatch or a bad hash."""
        try:
            return await self._offload(self._hasher.verify, stored_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False

    def needs_rehash(self, stored_hash: str) -> bool:
        """True when the hash was made with other parameters than the current ones."""
        try:
            return self._hasher.check_needs_rehash(stored_hash)
        except InvalidHashError:
            return True

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
