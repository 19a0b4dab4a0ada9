"""JWT access and refresh tokens (HS256) with the claims of SPEC §2."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jwt

from orchestra.errors import TokenExpiredError, TokenInvalidError

ISSUER = "orchestra"
ALGORITHM = "HS256"
REQUIRED_CLAIMS = ["sub", "name", "role", "type", "jti", "iat", "exp", "iss"]
ACCESS, REFRESH = "access", "refresh"
VERIFIED_CACHE_SIZE = 4096


@dataclass(frozen=True)
class IssuedToken:
    token: str
    jti: str
    expires_at: int  # unix seconds


class TokenService:
    def __init__(self, *, secret: str, access_ttl: int, refresh_ttl: int) -> None:
        self._secret = secret
        self._ttl = {ACCESS: access_ttl, REFRESH: refresh_ttl}
        # token -> claims that passed signature and claim checks. A signature check
        # costs ~100 us on a small machine, more than the rest of a request: each
        # token is verified once, then only its expiry and type are checked again.
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def issue(self, *, user_id: str, name: str, role: str, token_type: str) -> IssuedToken:
        now = int(time.time())
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
        return IssuedToken(jwt.encode(claims, self._secret, algorithm=ALGORITHM), jti, claims["exp"])

    def decode(self, token: str, *, expected_type: str) -> dict[str, Any]:
        """Verified claims of `token`; raises TokenExpiredError or TokenInvalidError."""
        claims = self._verified.get(token)
        if claims is None:
            claims = self._verify(token)
            self._verified[token] = claims
            if len(self._verified) > VERIFIED_CACHE_SIZE:
                self._verified.popitem(last=False)
        elif claims["exp"] <= time.time():  # what PyJWT checks on every decode
            del self._verified[token]
            raise TokenExpiredError()
        if claims.get("type") != expected_type:
            raise TokenInvalidError(
                f"A {claims.get('type')} token cannot be used here; send the {expected_type} token."
            )
        return dict(claims)

    def _verify(self, token: str) -> dict[str, Any]:
        """Signature, algorithm, issuer, expiry and the shape of every claim."""
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={"require": REQUIRED_CLAIMS},
            )
        except jwt.ExpiredSignatureError:
            raise TokenExpiredError() from None
        except jwt.PyJWTError as exc:
            raise TokenInvalidError(f"The token is invalid: {exc}.") from None
        for claim in ("sub", "name", "role", "jti"):
            if not isinstance(claims.get(claim), str):
                raise TokenInvalidError(f"The token's '{claim}' claim is malformed.")
        return claims
