"""Throttles that read their rate when used, so settings changes take effect at once."""

from rest_framework import throttling
from rest_framework.settings import api_settings


class _LazyRate:
    scope: str

    def get_rate(self) -> str | None:
        # DRF's rates are "N/period" strings; its stubs type them as numbers.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)  # type: ignore[return-value]


class AnonThrottle(_LazyRate, throttling.AnonRateThrottle):
    scope = "anon"


class UserThrottle(_LazyRate, throttling.UserRateThrottle):
    scope = "user"
