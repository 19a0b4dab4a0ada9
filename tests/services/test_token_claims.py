"""Every claim is type-checked once, before any comparison: a signed token whose claims
have the wrong types is TokenInvalidError on its first use and on every later one."""

from __future__ import annotations

import time

import jwt
import pytest

from orchestra.errors import TokenExpiredError, TokenInvalidError
from orchestra.services.tokens import ACCESS, TokenService

SECRET = "claims-secret-" + "z" * 32


@pytest.fixture
def service() -> TokenService:
    return TokenService(secret=SECRET, access_ttl=900, refresh_ttl=3600)


def good_claims(service: TokenService) -> dict:
    token = service.issue(user_id="u1", name="ann", role="USER", token_type=ACCESS).token
    return jwt.decode(token, SECRET, algorithms=["HS256"], issuer="orchestra")


@pytest.mark.parametrize(
    "change",
    [
        {"exp": "9999999999"},
        {"exp": True},
        {"exp": None},
        {"iat": "0"},
        {"iat": [1]},
        {"nbf": "0"},
        {"nbf": False},
        {"sub": 1},
        {"name": None},
        {"role": {"r": "USER"}},
        {"type": ["access"]},
        {"jti": 7},
    ],
    ids=lambda change: next(iter(change)) + "=" + repr(next(iter(change.values()))),
)
def test_a_claim_of_the_wrong_type_is_invalid_every_time(service, change):
    token = jwt.encode({**good_claims(service), **change}, SECRET, algorithm="HS256")
    for _ in range(3):
        with pytest.raises(TokenInvalidError):
            service.decode(token, expected_type=ACCESS)


def test_times_still_mean_what_they_say(service):
    claims = good_claims(service)
    now = time.time()
    expired = jwt.encode({**claims, "exp": now - 1}, SECRET, algorithm="HS256")
    with pytest.raises(TokenExpiredError):
        service.decode(expired, expected_type=ACCESS)
    not_yet = jwt.encode({**claims, "nbf": now + 600}, SECRET, algorithm="HS256")
    with pytest.raises(TokenInvalidError):
        service.decode(not_yet, expected_type=ACCESS)
    future = jwt.encode({**claims, "iat": now + 600}, SECRET, algorithm="HS256")
    with pytest.raises(TokenInvalidError):
        service.decode(future, expected_type=ACCESS)
    fractional = jwt.encode({**claims, "exp": now + 60.5, "nbf": now - 1.5}, SECRET, algorithm="HS256")
    assert service.decode(fractional, expected_type=ACCESS)["sub"] == "u1"
    assert service.decode(fractional, expected_type=ACCESS)["sub"] == "u1"  # remembered
