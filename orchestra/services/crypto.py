"""Encryption at rest for provider API keys: Fernet with a key derived from the server secret."""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


class SecretBox:
    def __init__(self, server_secret: str) -> None:
        key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=b"orchestra", info=b"provider-api-keys"
        ).derive(server_secret.encode())
        self._fernet = Fernet(base64.urlsafe_b64encode(key))

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, ciphertext: str) -> str:
        """The plain text; ValueError when the server secret changed since it was stored."""
        try:
            return self._fernet.decrypt(ciphertext.encode()).decode()
        except InvalidToken:
            raise ValueError("stored secret cannot be decrypted with this server's key") from None


def mask(secret: str) -> str:
    """`sk-…abcd`: enough to recognise a key, never enough to use it."""
    if len(secret) <= 8:
        return "…" + secret[-2:] if len(secret) > 2 else "…"
    prefix = secret[:3]
    return f"{prefix}…{secret[-4:]}"
