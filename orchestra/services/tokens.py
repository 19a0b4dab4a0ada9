"""JWT access and refresh tokens (HS256) with the claims of SPEC §2."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt

from orchestra.errors import TokenExpiredError, TokenInvalidError

ISSUER = "orchestra"
ALGORITHM = "HS256"
REQUIRED_CLAIMS = ["sub", "name", "role", "type", "jti", "iat", "exp", "iss"]
ACCESS, REFRESH = "access", "refresh"


@dataclass(frozen=True)
class IssuedToken:
    token: str
    jti: str
    expires_at: int  # unix seconds


class TokenService:
    def __init__(self, *, secret: str, access_ttl: int, refresh_ttl: int) -> None:
        self._secret = secret
        self._ttl = {ACCESS: access_ttl, REFRESH: refresh_ttl}

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
        if claims.get("type") != expected_type:
            raise TokenInvalidError(
                f"A {claims.get('type')} token cannot be used here; send the {expected_type} token."
            )
        for claim in ("sub", "name", "role", "jti"):
            if not isinstance(claims.get(claim), str):
                raise TokenInvalidError(f"The token's '{claim}' claim is malformed.")
        return claims
