"""Per-address limits on the page forms: sign-up (and its confirming step), password reset,
login and adding an SSH key.

Each form keeps its own count per client address (`gpuplatform.http.client_address`) in a
fixed window in the cache (Redis in production, so every web process shares it). Every
POST counts, accepted or refused; past the form's rate the page answers 429 with
Retry-After and runs nothing: no account, no key, no mail. The forms that send mail use
settings.MAIL_FORM_RATE, the others settings.FORM_RATE (DRF's syntax, "20/min"). The
per-account lockout of failed logins (tenants/login.py) stands apart and still applies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render

from gpuplatform.http import client_address

# Which rate each limited form takes (the setting's name).
FORM_RATE_SETTING = {
    "signup": "MAIL_FORM_RATE",
    "password_reset": "MAIL_FORM_RATE",
    "signup_confirm": "FORM_RATE",
    "login": "FORM_RATE",
    "ssh_key_add": "FORM_RATE",
}
PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

V = TypeVar("V", bound=Callable[..., HttpResponseBase])


def parse_rate(rate: str) -> tuple[int, int]:
    """`"20/min"` -> (20, 60): how many in how many seconds (sec, min, hour, day)."""
    count, _, period = rate.partition("/")
    unit = period.strip()[:1].lower()
    if unit not in PERIODS or not count.strip().isdigit():
        raise ValueError(f"not a rate: {rate!r} (write it like 20/min or 10/hour)")
    return int(count), PERIODS[unit]


def rate_of(form: str) -> tuple[int, int]:
    return parse_rate(getattr(settings, FORM_RATE_SETTING[form]))


def _key(form: str, address: str, period: int, window: int) -> str:
    return f"form-rate:{form}:{period}:{address}:{window}"


def attempt(request: HttpRequest, form: str) -> int:
    """Count this POST against its address's rate for `form`: 0 while within it, else
    the seconds until the window ends."""
    limit, period = rate_of(form)
    now = time.time()
    window = int(now // period)
    key = _key(form, client_address(request), period, window)
    cache.add(key, 0, period + 1)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, period + 1)
        count = 1
    if count <= limit:
        return 0
    return max(1, math.ceil((window + 1) * period - now))


def wait_message(wait_s: int) -> str:
    wait = f"{wait_s} seconds" if wait_s < 120 else f"{math.ceil(wait_s / 60)} minutes"
    return f"Too many attempts from your address: wait {wait} and try again."


def refused_page(request: HttpRequest, wait_s: int) -> HttpResponse:
    response = render(
        request, "too_many_attempts.html", {"message": wait_message(wait_s)}, status=429
    )
    response["Retry-After"] = str(wait_s)
    return response


def refusal(request: HttpRequest, form: str) -> HttpResponse | None:
    """None for a GET or a POST within the rate (the POST is counted); else the 429 page."""
    if request.method != "POST":
        return None
    wait_s = attempt(request, form)
    return refused_page(request, wait_s) if wait_s else None


def limit_posts(form: str) -> Callable[[V], V]:
    """A view decorator: POSTs past `form`'s rate get the 429 page, the view never runs."""

    def decorate(view: V) -> V:
        @wraps(view)
        def limited(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            refused = refusal(request, form)
            return refused if refused is not None else view(request, *args, **kwargs)

        return cast(V, limited)

    return decorate


def reset(*, address: str) -> None:
    """Forget the current counts of `address` for every form (a test's fresh start, or ops
    letting an office back in at once)."""
    now = time.time()
    cache.delete_many(
        [
            _key(form, address, period, int(now // period) - back)
            for form in FORM_RATE_SETTING
            for period in PERIODS.values()  # whatever rate a setting names
            for back in (0, 1)
        ]
    )
