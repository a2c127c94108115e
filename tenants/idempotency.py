"""An Idempotency-Key as a purchase, a grant or a launch is sent it, checked: a retry with
the same key does nothing twice. No query and no write."""

from __future__ import annotations

from gpuplatform.errors import ServiceError


def clean_idempotency_key(key: str) -> str:
    key = (key or "").strip()
    if len(key) > 128 or any(ord(c) < 33 or ord(c) > 126 for c in key):
        raise ServiceError(
            "The Idempotency-Key must be 1 to 128 printable ASCII characters without spaces.",
            field="idempotency_key",
        )
    return key
