"""Rate limits shared by several server processes through Redis (ORCHESTRA_LIMITER_STORAGE).

Two apps stand for two workers: what one counts, the other refuses. Uses the Redis
server at ORCHESTRA_TEST_REDIS_URL (e.g. redis://127.0.0.1:6379, as .ci/run sets it),
database 7 unless the URL names one (7 + n in pytest-xdist worker n: tests/parallel.py),
emptied before and after. Without the variable
the test skips and says why; with it set, an unreachable Redis fails the test.
"""

import os
import socket
from urllib.parse import urlparse

import pytest

from tests.conftest import make_settings, running_app
from tests.parallel import redis_database

TEST_DATABASE = 7  # away from database 0, which a developer's own Redis may use


def redis_test_url() -> str | None:
    """ORCHESTRA_TEST_REDIS_URL with a database number (when it names none: 7, one more
    per pytest-xdist worker, so that workers never empty each other's)."""
    raw = os.environ.get("ORCHESTRA_TEST_REDIS_URL") or None
    if raw is None:
        return None
    parsed = urlparse(raw)
    if parsed.path.strip("/"):
        return raw
    return parsed._replace(path=f"/{redis_database(TEST_DATABASE)}").geturl()


@pytest.fixture
async def redis_storage_uri():
    url = redis_test_url()
    if url is None:
        pytest.skip("shared-limit tests need ORCHESTRA_TEST_REDIS_URL (see .ci/run)")
    parsed = urlparse(url)
    try:
        socket.create_connection((parsed.hostname, parsed.port or 6379), timeout=2).close()
    except OSError as exc:
        pytest.fail(f"ORCHESTRA_TEST_REDIS_URL is set but Redis at {url} is not reachable: {exc}",
                    pytrace=False)
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    await client.flushdb()
    yield f"async+{url}"
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


async def flood_two_workers(settings) -> tuple[list[int], dict, int]:
    """Two apps on one PostgreSQL store, one user with two hooks: three signed calls of
    the first hook spread over both apps, a fourth on the second app, then a call of the
    other hook there. (codes of the three, the fourth's answer, the other hook's code)."""
    from tests.conftest import Users
    from tests.web.test_hooks import make_hook, path, signed, template

    body = b'{"a":1}'
    async with running_app(settings) as first, running_app(settings) as second:
        who = await Users(first).make("alice")
        tid = await template(first, who)
        one, other = await make_hook(first, who, tid), await make_hook(first, who, tid)
        codes = [(await app.post(path(one), content=body, headers=signed(one["secret"], body))).status_code
                 for app in (first, second, first)]
        fourth = await second.post(path(one), content=body, headers=signed(one["secret"], body))
        elsewhere = await second.post(path(other), content=body, headers=signed(other["secret"], body))
        return codes, {"status": fourth.status_code, "headers": dict(fourth.headers), "body": fourth.json()}, \
            elsewhere.status_code


async def test_two_workers_share_a_hooks_limit_through_redis(tmp_path, postgres_url, redis_storage_uri):
    settings = make_settings(tmp_path / "home", postgres_url,
                             limiter_storage=redis_storage_uri, rate_limit_hook="3/minute")
    codes, fourth, elsewhere = await flood_two_workers(settings)
    assert codes == [202, 202, 202]
    assert fourth["status"] == 429 and fourth["body"]["error"] == "RateLimitedError"
    assert fourth["headers"]["ratelimit-limit"] == "3" and fourth["headers"]["ratelimit-remaining"] == "0"
    assert int(fourth["headers"]["retry-after"]) >= 1
    assert elsewhere == 202  # a flood on one hook leaves the others alone


async def test_with_the_default_storage_each_worker_counts_a_hook_on_its_own(tmp_path, postgres_url):
    """As documented (docs/operations.md, "Inbound webhooks"): without Redis a hook's
    limit is per process — N processes behind a balancer admit up to N times it."""
    settings = make_settings(tmp_path / "home", postgres_url, rate_limit_hook="3/minute")
    assert settings.limiter_storage == "async+memory://"
    codes, fourth, elsewhere = await flood_two_workers(settings)
    assert codes == [202, 202, 202]
    assert fourth["status"] == 202 and fourth["headers"]["ratelimit-remaining"] == "1"  # the second's 2nd of 3
    assert elsewhere == 202
