"""Throttles that read their rate when used, so settings changes take effect at once."""

from typing import Any

from rest_framework import throttling
from rest_framework.settings import api_settings

from gpuplatform.http import client_address


class _LazyRate:
    scope: str

    def get_rate(self) -> str | None:
        # DRF's rates are "N/period" strings; its stubs type them as numbers.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)  # type: ignore[return-value]

    def get_ident(self, request: Any) -> str:
        # The platform's one reading of the caller's address (X-Forwarded-For only from
        # proxies settings name); DRF's own would trust the header of anyone.
        return client_address(request)


class AnonThrottle(_LazyRate, throttling.AnonRateThrottle):
    scope = "anon"


class UserThrottle(_LazyRate, throttling.UserRateThrottle):
    scope = "user"
