"""Puts the signed-in user's membership (tenant and role) into every template."""

from django.http import HttpRequest

from .selectors import membership_for_user


def membership(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"membership": None}
    # Views set request.membership when they load it; load it here only otherwise.
    if not hasattr(request, "membership"):
        request.membership = membership_for_user(user)  # type: ignore[attr-defined]
    return {"membership": request.membership}  # type: ignore[attr-defined]
