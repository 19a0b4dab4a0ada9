"""JWT access and refresh tokens (HS256) with the claims of SPEC §2."""

from __future__ import annotations

import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt

from orchestra.errors import TokenExpiredError, TokenInvalidError

ISSUER = "orchestra"
ALGORITHM = "HS256"
REQUIRED_CLAIMS = ["sub", "name", "role", "type", "jti", "iat", "exp", "iss"]
FAMILY_CLAIM = "fam"  # the refresh family an access token belongs to (absent on older tokens)
ACCESS, REFRESH = "access", "refresh"
VERIFIED_CACHE_SIZE = 4096


@dataclass(frozen=True)
class IssuedToken:
    token: str
    jti: str
    expires_at: int  # unix seconds


class TokenService:
    """Issues and checks tokens. `clock` (unix seconds) is the time every `iat`, `exp`
    and expiry check reads: tests move it instead of waiting for a token to expire."""

    def __init__(self, *, secret: str, access_ttl: int, refresh_ttl: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._clock = clock
        self._ttl = {ACCESS: access_ttl, REFRESH: refresh_ttl}
        # token -> claims that passed signature and claim checks. A signature check
        # costs ~100 us on a small machine, more than the rest of a request: each
        # token is verified once, then only its expiry and type are checked again.
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def issue(self, *, user_id: str, name: str, role: str, token_type: str,
              family: str | None = None) -> IssuedToken:
        """A signed token; `family` names the refresh family it belongs to (`fam`), so
        that revoking the family stops the token at once."""
        now = int(self._clock())
        jti = uuid.uuid4().hex
        claims = {
            "sub": user_id,
            "name": name,
            "role": role,
            "type": token_type,
            "jti": jti,
            "iat": now,
            "exp": now + self._ttl[token_type],
            "iss": ISSUER,
        }
        if family is not None:
            claims[FAMILY_CLAIM] = family
        return IssuedToken(jwt.encode(claims, self._secret, algorithm=ALGORITHM), jti, claims["exp"])

    def decode(self, token: str, *, expected_type: str) -> dict[str, Any]:
        """Verified claims of `token`; raises TokenExpiredError or TokenInvalidError."""
        claims = self._verified.get(token)
        if claims is None:
            claims = self._verify(token)
            self._verified[token] = claims
            if len(self._verified) > VERIFIED_CACHE_SIZE:
                self._verified.popitem(last=False)
        elif claims["exp"] <= self._clock():  # what PyJWT checks on every decode
            del self._verified[token]
            raise TokenExpiredError()
        if claims.get("type") != expected_type:
            raise TokenInvalidError(
                f"A {claims.get('type')} token cannot be used here; send the {expected_type} token."
            )
        return dict(claims)

    def _verify(self, token: str) -> dict[str, Any]:
        """Signature, algorithm, issuer and presence of every claim (PyJWT), then the
        type of every claim, then the times: types first, so that a time of the wrong
        type (PyJWT reads "123" and true as numbers) is invalid, never expired or a 500."""
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={"require": REQUIRED_CLAIMS, "verify_exp": False, "verify_iat": False,
                         "verify_nbf": False},
            )
        except jwt.PyJWTError as exc:
            raise TokenInvalidError(f"The token is invalid: {exc}.") from None
        claims = _checked_claims(claims)
        now = self._clock()
        if claims["exp"] <= now:  # as PyJWT checks it, with no leeway
            raise TokenExpiredError()
        if claims["iat"] > now + 1 or claims.get("nbf", 0) > now:
            raise TokenInvalidError("The token is not valid yet.")
        return claims


STRING_CLAIMS = ("sub", "name", "role", "type", "jti", "iss")
OPTIONAL_STRING_CLAIMS = (FAMILY_CLAIM,)
TIME_CLAIMS = ("exp", "iat", "nbf")  # nbf only when present


def _checked_claims(claims: dict[str, Any]) -> dict[str, Any]:
    """The claims when each has its type: strings, and times that are real numbers (PyJWT
    accepts "123" for `exp`, which later broke the expiry check of the cache with a 500)."""
    for claim in STRING_CLAIMS:
        if not isinstance(claims.get(claim), str):
            raise TokenInvalidError(f"The token's '{claim}' claim is malformed.")
    for claim in OPTIONAL_STRING_CLAIMS:
        if claim in claims and not isinstance(claims[claim], str):
            raise TokenInvalidError(f"The token's '{claim}' claim is malformed.")
    for claim in TIME_CLAIMS:
        if claim == "nbf" and claim not in claims:
            continue
        value = claims.get(claim)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TokenInvalidError(f"The token's '{claim}' claim is malformed.")
    return claims
