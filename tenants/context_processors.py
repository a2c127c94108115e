"""Puts the signed-in user's membership (tenant and role) and the credit rate into every
template."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from .money import Rate
from .selectors import credit_rate_current, membership_for_user


def membership(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"membership": None}
    # Views set request.membership when they load it; load it here only otherwise. (The
    # attribute is set on the request on purpose: the ignores below say so.)
    if not hasattr(request, "membership"):
        request.membership = membership_for_user(user)  # type: ignore[attr-defined]  # see above
    return {"membership": request.membership}  # type: ignore[attr-defined]  # see above


def request_credit_rate(request: HttpRequest) -> Rate:
    """What a credit is worth for this request: read once, shared by the view, its forms
    and the templates."""
    if not hasattr(request, "credit_rate"):  # kept on the request: one read per request
        request.credit_rate = credit_rate_current()  # type: ignore[attr-defined]  # a cache
    return request.credit_rate  # type: ignore[attr-defined]  # the cache above


def credit_rate(request: HttpRequest) -> dict[str, SimpleLazyObject]:
    """The rate for templates, read only if a page shows money."""
    return {"credit_rate": SimpleLazyObject(lambda: request_credit_rate(request))}
