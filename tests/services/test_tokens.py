"""TokenService: HS256 JWTs with exactly the claims of SPEC §2, decoded strictly."""

from __future__ import annotations

import time

import jwt
import pytest

from orchestra.errors import TokenExpiredError, TokenInvalidError
from orchestra.services.tokens import ACCESS, REFRESH, TokenService

SECRET = "s" * 48


@pytest.fixture
def tokens() -> TokenService:
    return TokenService(secret=SECRET, access_ttl=900, refresh_ttl=604800)


def issue(tokens, kind=ACCESS):
    return tokens.issue(user_id="u-1", name="alice", role="USER", token_type=kind)


def test_claims_and_lifetimes(tokens):
    for kind, ttl in ((ACCESS, 900), (REFRESH, 604800)):
        issued = issue(tokens, kind)
        assert jwt.get_unverified_header(issued.token) == {"alg": "HS256", "typ": "JWT"}
        claims = jwt.decode(issued.token, SECRET, algorithms=["HS256"])
        assert set(claims) == {"sub", "name", "role", "type", "jti", "iat", "exp", "iss"}
        assert claims["iss"] == "orchestra" and claims["type"] == kind
        assert claims["exp"] - claims["iat"] == ttl and claims["exp"] == issued.expires_at
        assert claims["jti"] == issued.jti
        assert abs(claims["iat"] - time.time()) < 5
        assert tokens.decode(issued.token, expected_type=kind) == claims


def test_every_token_has_its_own_jti(tokens):
    assert len({issue(tokens).jti for _ in range(50)}) == 50


def test_type_is_enforced(tokens):
    with pytest.raises(TokenInvalidError, match="refresh token cannot be used"):
        tokens.decode(issue(tokens, REFRESH).token, expected_type=ACCESS)
    with pytest.raises(TokenInvalidError, match="access token cannot be used"):
        tokens.decode(issue(tokens, ACCESS).token, expected_type=REFRESH)


def _claims(**changes):
    now = int(time.time())
    claims = {"sub": "u-1", "name": "alice", "role": "USER", "type": "access", "jti": "j",
              "iat": now, "exp": now + 60, "iss": "orchestra", **changes}
    return {k: v for k, v in claims.items() if v is not None}


def test_refusals(tokens):
    bad = [
        jwt.encode(_claims(), None, algorithm="none"),
        jwt.encode(_claims(), "another-secret-that-is-long-enough-xx", algorithm="HS256"),
        jwt.encode(_claims(), SECRET, algorithm="HS384"),
        jwt.encode(_claims(iss="evil"), SECRET, algorithm="HS256"),
        jwt.encode(_claims(sub=5), SECRET, algorithm="HS256"),
        jwt.encode(_claims(jti=None), SECRET, algorithm="HS256"),
        "a.b.c", "", "x" * 1000, "\x00",
    ]
    for token in bad:
        with pytest.raises(TokenInvalidError):
            tokens.decode(token, expected_type=ACCESS)
    for missing in ("sub", "name", "role", "type", "jti", "iat", "exp", "iss"):
        with pytest.raises(TokenInvalidError):
            tokens.decode(jwt.encode(_claims(**{missing: None}), SECRET, algorithm="HS256"),
                          expected_type=ACCESS)


def test_expired(tokens):
    past = int(time.time()) - 100
    token = jwt.encode(_claims(iat=past - 60, exp=past), SECRET, algorithm="HS256")
    with pytest.raises(TokenExpiredError):
        tokens.decode(token, expected_type=ACCESS)
    # An expired token with a bad signature is invalid, not merely expired.
    token = jwt.encode(_claims(iat=past - 60, exp=past), "other-secret-long-enough-xxxxxxxx", algorithm="HS256")
    with pytest.raises(TokenInvalidError):
        tokens.decode(token, expected_type=ACCESS)
