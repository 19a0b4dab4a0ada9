"""TokenService remembers verified tokens: the remembered answer must equal a fresh one."""

from __future__ import annotations

import time

import jwt
import pytest

from orchestra.errors import TokenExpiredError, TokenInvalidError
from orchestra.services import tokens as tokens_module
from orchestra.services.tokens import ACCESS, REFRESH, TokenService

SECRET = "cache-secret-" + "q" * 32


class Clock:
    """A clock the test moves: unix seconds."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))  # whole seconds, as `iat` and `exp` are

    def __call__(self) -> float:
        return self.now


def _service(access_ttl: int = 900, clock=time.time) -> TokenService:
    return TokenService(secret=SECRET, access_ttl=access_ttl, refresh_ttl=3600, clock=clock)


def test_a_remembered_token_still_expires():
    clock = Clock()
    service = _service(access_ttl=1, clock=clock)
    token = service.issue(user_id="u1", name="ann", role="USER", token_type=ACCESS).token
    assert service.decode(token, expected_type=ACCESS)["sub"] == "u1"
    clock.now += 0.5
    assert service.decode(token, expected_type=ACCESS)["sub"] == "u1"  # remembered, still valid
    clock.now += 1.5
    with pytest.raises(TokenExpiredError):
        service.decode(token, expected_type=ACCESS)
    with pytest.raises(TokenExpiredError):  # and stays expired on the slow path
        service.decode(token, expected_type=ACCESS)


def test_a_remembered_token_is_still_refused_as_the_other_type():
    service = _service()
    access = service.issue(user_id="u1", name="ann", role="USER", token_type=ACCESS).token
    refresh = service.issue(user_id="u1", name="ann", role="USER", token_type=REFRESH).token
    for _ in range(2):  # first verified, then remembered
        with pytest.raises(TokenInvalidError):
            service.decode(access, expected_type=REFRESH)
        with pytest.raises(TokenInvalidError):
            service.decode(refresh, expected_type=ACCESS)
        assert service.decode(access, expected_type=ACCESS)["type"] == ACCESS


def test_claims_handed_out_cannot_change_the_remembered_ones():
    service = _service()
    token = service.issue(user_id="u1", name="ann", role="USER", token_type=ACCESS).token
    service.decode(token, expected_type=ACCESS)["role"] = "SUPER_ADMINISTRATOR"
    assert service.decode(token, expected_type=ACCESS)["role"] == "USER"


def test_a_forged_token_is_never_remembered_as_valid():
    service = _service()
    good = service.issue(user_id="u1", name="ann", role="USER", token_type=ACCESS).token
    service.decode(good, expected_type=ACCESS)
    claims = jwt.decode(good, SECRET, algorithms=["HS256"], issuer="orchestra")
    forged = jwt.encode({**claims, "role": "SUPER_ADMINISTRATOR"}, "another-secret-" + "x" * 32,
                        algorithm="HS256")
    for _ in range(2):
        with pytest.raises(TokenInvalidError):
            service.decode(forged, expected_type=ACCESS)
    other_service = TokenService(secret="another-" + "y" * 40, access_ttl=900, refresh_ttl=900)
    with pytest.raises(TokenInvalidError):  # the memory is per secret (per service)
        other_service.decode(good, expected_type=ACCESS)


def test_the_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(tokens_module, "VERIFIED_CACHE_SIZE", 5)
    service = _service()
    issued = [service.issue(user_id=f"u{n}", name="ann", role="USER", token_type=ACCESS).token
              for n in range(12)]
    for token in issued:
        service.decode(token, expected_type=ACCESS)
    assert len(service._verified) == 5
    assert service.decode(issued[0], expected_type=ACCESS)["sub"] == "u0"  # verified again
