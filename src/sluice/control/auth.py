"""Tenants and tokens. Tokens are shown once and stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import hmac
import secrets

TOKEN_PREFIX = "slc_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a, b)
