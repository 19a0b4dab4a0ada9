"""Rate limits shared by several server processes through Redis (ORCHESTRA_LIMITER_STORAGE).

Two apps stand for two workers: what one counts, the other refuses. Uses Redis
database 7 at ORCHESTRA_TEST_REDIS_URL (default redis://127.0.0.1:6379/7), emptied
first; skips with the reason when no Redis answers.
"""

import os
import socket
from urllib.parse import urlparse

import pytest

from tests.conftest import make_settings, running_app

REDIS_URL = os.environ.get("ORCHESTRA_TEST_REDIS_URL", "redis://127.0.0.1:6379/7")


@pytest.fixture
async def redis_storage_uri():
    parsed = urlparse(REDIS_URL)
    try:
        socket.create_connection((parsed.hostname, parsed.port or 6379), timeout=1).close()
    except OSError as exc:
        pytest.skip(f"shared-limit tests need Redis at {REDIS_URL}: {exc}")
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS_URL)
    await client.flushdb()
    yield f"async+{REDIS_URL}"
    await client.flushdb()
    await client.aclose()


async def test_two_workers_share_the_login_limit(tmp_path, sqlite_url, redis_storage_uri):
    settings = make_settings(
        tmp_path / "home", sqlite_url,
        limiter_storage=redis_storage_uri, rate_limit_login="3/minute",
    )
    body = {"user_name": "nobody", "password": "password-123"}
    async with running_app(settings) as first, running_app(settings) as second:
        answers = [(await first.post("/api/v1/auth/login", json=body)).status_code for _ in range(2)]
        answers.append((await second.post("/api/v1/auth/login", json=body)).status_code)
        refused = await second.post("/api/v1/auth/login", json=body)
        again = await first.post("/api/v1/auth/login", json=body)
    assert answers == [404, 404, 404]
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"] == "RateLimitedError"
    assert refused.headers["RateLimit-Limit"] == "3"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert int(refused.headers["Retry-After"]) >= 1
    assert again.status_code == 429
