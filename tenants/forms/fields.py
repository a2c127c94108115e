"""What the tenants app's forms share: the per-form idempotency token."""

from __future__ import annotations

import secrets
from typing import Any

from django import forms


def new_form_token() -> str:
    """The per-form Idempotency-Key: a double submit of one rendered form acts once."""
    return secrets.token_urlsafe(24)


class TokenField(forms.CharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=128, widget=forms.HiddenInput, **kwargs)
