"""Secrets the platform keeps only to use them later (a tenant's registry credentials),
sealed at rest with Fernet (cryptography's: AES-128-CBC with an HMAC-SHA256, a timestamp
and a random IV per token). The key is derived with HKDF-SHA256 from
`settings.CREDENTIALS_KEYS` (GPUPLATFORM_CREDENTIALS_KEYS: the first seals, every one
unseals, so a new key goes first and the old one stays until everything is sealed again),
or, when none is set, from DJANGO_SECRET_KEY under a label of its own (changing the
secret key then makes every sealed secret unreadable: docs/images.md)."""

from __future__ import annotations

import base64
import json

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

_SALT = b"gpuplatform sealed secrets"


class Unreadable(Exception):
    """The sealed text was sealed under a key the platform no longer has, or is damaged."""


def _fernet_key(secret: str, label: bytes) -> bytes:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=label).derive(
        secret.encode("utf-8")
    )
    return base64.urlsafe_b64encode(derived)


def _fernet() -> MultiFernet:
    secrets = [k for k in settings.CREDENTIALS_KEYS if k.strip()]
    if secrets:
        keys = [_fernet_key(k.strip(), b"credentials key") for k in secrets]
    else:
        keys = [_fernet_key(settings.SECRET_KEY, b"credentials key from SECRET_KEY")]
    return MultiFernet([Fernet(k) for k in keys])


def seal(data: dict[str, str]) -> str:
    """`data` sealed: ASCII text to store; only `unseal` (with a key still configured)
    reads it back."""
    return _fernet().encrypt(json.dumps(data, sort_keys=True).encode()).decode("ascii")


def unseal(token: str) -> dict[str, str]:
    try:
        data = json.loads(_fernet().decrypt(token.encode("ascii")))
    except (InvalidToken, ValueError, UnicodeError) as exc:
        raise Unreadable("sealed under a key this platform no longer has") from exc
    if not isinstance(data, dict):
        raise Unreadable("not a sealed mapping")
    return {str(k): str(v) for k, v in data.items()}


def reseal(token: str) -> str:
    """The same secret sealed again under the first key (after a key rotation)."""
    try:
        return _fernet().rotate(token.encode("ascii")).decode("ascii")
    except (InvalidToken, ValueError, UnicodeError) as exc:
        raise Unreadable("sealed under a key this platform no longer has") from exc
