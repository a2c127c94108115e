"""An Idempotency-Key as a purchase, a grant, a launch, a resume or a volume is sent it,
checked, and what the keyed request asked for, fingerprinted: a retry with the same key
and the same request does nothing twice; the same key with any other request is a 409
`idempotency_conflict`, never a silent replay of the first answer. No query, no write."""

from __future__ import annotations

import hashlib
import json

from gpuplatform.errors import Conflict, ServiceError


def clean_idempotency_key(key: str) -> str:
    key = (key or "").strip()
    if len(key) > 128 or any(ord(c) < 33 or ord(c) > 126 for c in key):
        raise ServiceError(
            "The Idempotency-Key must be 1 to 128 printable ASCII characters without spaces.",
            field="idempotency_key",
        )
    return key


def request_fingerprint(**asked: object) -> str:
    """SHA-256 of a request's cleaned inputs, in a canonical JSON form (keys sorted, so
    the order a client sent them in does not matter; values as the service reads them)."""
    body = json.dumps(asked, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


class IdempotencyConflict(Conflict):
    """A used key sent with another request (409 `idempotency_conflict`)."""

    default_code = "idempotency_conflict"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"This Idempotency-Key was used for a different {what}: send a new key for a "
            "new request, or the same request to replay it.",
            field="idempotency_key",
        )


def replay_check(
    *, stored: str, fingerprint: str, what: str, kept_fields_match: bool = True
) -> None:
    """Refuse a replay whose request differs from the first. A row made before
    fingerprints were kept has none: then the fields it keeps decide (`kept_fields_match`,
    the caller's comparison)."""
    if (stored != fingerprint) if stored else not kept_fields_match:
        raise IdempotencyConflict(what)
