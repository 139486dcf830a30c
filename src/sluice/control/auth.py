"""Tenants and tokens. Tokens are shown once and stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Protocol

TOKEN_PREFIX = "slc_"


class Caller(Protocol):
    """An authenticated tenant, as every control-plane call that checks ownership sees it."""

    name: str
    admin: bool


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a, b)
