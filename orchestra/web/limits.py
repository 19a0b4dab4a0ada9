"""Per-client rate limiters (limits.aio), checked before anything else in a handler."""

from __future__ import annotations

import math
import time
from functools import wraps

from limits import parse
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string
from sanic import Request

from orchestra.errors import OrchestraError, RateLimitedError
from orchestra.settings import Settings


class RateLimits:
    """The named limiters of the service (`register`, `login`, `hook`, `hook_unverified`),
    sharing one storage."""

    def __init__(self, settings: Settings) -> None:
        self._limiter = MovingWindowRateLimiter(_storage(settings.limiter_storage))
        self._items = {
            "register": parse(settings.rate_limit_register),
            "login": parse(settings.rate_limit_login),
            "hook": parse(settings.rate_limit_hook),  # verified calls, keyed by hook id
            # calls to any hook that did not verify, keyed by client address
            "hook_unverified": parse(settings.rate_limit_hook_unverified),
        }

    async def hit(self, name: str, client: str) -> dict[str, str]:
        """Count one request; the RateLimit-* headers, or RateLimitedError past the limit."""
        item = self._items[name]
        allowed = await self._limiter.hit(item, name, client)
        stats = await self._limiter.get_window_stats(item, name, client)
        reset = max(0, math.ceil(stats.reset_time - time.time()))
        headers = {
            "RateLimit-Limit": str(item.amount),
            "RateLimit-Remaining": str(stats.remaining),
            "RateLimit-Reset": str(reset),
        }
        if not allowed:
            said = _TOO_MANY.get(name, f"Too many {name} attempts")
            raise RateLimitedError(
                f"{said}; try again in {max(reset, 1)} seconds.",
                headers={**headers, "Retry-After": str(max(reset, 1))},
            )
        return headers


_TOO_MANY = {
    "hook": "Too many calls of this webhook (ORCHESTRA_RATE_LIMIT_HOOK)",
    "hook_unverified": "Too many webhook calls that did not verify from this address "
                       "(ORCHESTRA_RATE_LIMIT_HOOK_UNVERIFIED)",
}


def _storage(uri: str):
    """The limiter storage for `uri`; Redis through redis-py's asyncio client (the `redis` extra)."""
    if uri.split("://", 1)[0] in ("async+redis", "async+rediss", "async+redis+unix"):
        return storage_from_string(uri, implementation="redispy")
    return storage_from_string(uri)


def client_address(request: Request) -> str:
    """The client as SPEC §2 defines it: `request.remote_addr` (proxies per config), else peer IP."""
    return request.remote_addr or request.ip or "unknown"


def rate_limited(name: str):
    """Decorator: the `name` limiter runs first, before the body is even looked at."""

    def decorator(handler):
        @wraps(handler)
        async def wrapper(request: Request, *args, **kwargs):
            headers = await request.app.ctx.limits.hit(name, client_address(request))
            try:
                response = await handler(request, *args, **kwargs)
            except OrchestraError as exc:  # errors count against the limit too: say so
                exc.headers = {**headers, **exc.headers}
                raise
            response.headers.update(headers)
            return response

        wrapper.rate_limit = name  # read by the OpenAPI document (429, RateLimit-* headers)
        return wrapper

    return decorator
