"""The emailed link that finishes a sign-up.

Nothing is stored when someone fills in the sign-up form: what they typed (the address,
the organisation and the hash of their password) travels sealed inside the link to that
address, and the account is made only when the link is opened. The seal is Fernet (AES
with an HMAC, and the time it was made) under a key derived from SECRET_KEY (older keys
in SECRET_KEY_FALLBACKS still open links made under them): whoever reads the link learns
nothing from it, cannot change it, and cannot use it after SIGN_UP_LINK_TTL_HOURS.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.utils.crypto import salted_hmac

KEY_SALT = "tenants.sign_up_links"


@dataclass(frozen=True)
class SignUpClaim:
    """What the sign-up form was given: the address (normalised), the organisation's
    name and the password's hash (never the password)."""

    email: str
    tenant_name: str
    password_hash: str


def _fernet() -> MultiFernet:
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    keys = [
        Fernet(
            base64.urlsafe_b64encode(
                salted_hmac(KEY_SALT, "fernet", secret=s, algorithm="sha256").digest()
            )
        )
        for s in secrets
    ]
    return MultiFernet(keys)


def seal(claim: SignUpClaim) -> str:
    """The link's token: URL-safe, no slash."""
    body = json.dumps(
        {"email": claim.email, "tenant": claim.tenant_name, "password": claim.password_hash}
    ).encode()
    return _fernet().encrypt(body).decode("ascii")


def unseal(token: str) -> SignUpClaim | None:
    """The claim a token holds; None when it is forged, damaged or too old."""
    try:
        body = _fernet().decrypt(token.encode("ascii"), ttl=settings.SIGN_UP_LINK_TTL_HOURS * 3600)
        data = json.loads(body)
        return SignUpClaim(
            email=str(data["email"]),
            tenant_name=str(data["tenant"]),
            password_hash=str(data["password"]),
        )
    except (InvalidToken, UnicodeError, ValueError, KeyError, TypeError):
        return None
