"""Secrets handed to people (API tokens, invitation links): made random, stored as SHA-256.

These values carry 256 bits of randomness, so a fast hash is enough: nothing can be
guessed, and a leaked database row does not reveal the token.
"""

import hashlib
import secrets

API_TOKEN_PREFIX = "gpp_"  # noqa: S105 (a public prefix, not a secret)
DISPLAY_PREFIX_LENGTH = 12


def new_secret(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)


def hash_secret(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def display_prefix(value: str) -> str:
    return value[:DISPLAY_PREFIX_LENGTH]
