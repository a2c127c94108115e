"""Two-factor reads and the staff rule: a session or token of staff without a set-up,
verified second factor reaches no page but the code step, and no API (docs/two-factor.md)."""

from __future__ import annotations

import secrets
from base64 import b32encode
from binascii import unhexlify
from collections.abc import Callable
from urllib.parse import quote, urlencode

import segno
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpuplatform.errors import NotAllowed
from gpuplatform.http import PageRequest

from .tokens import hash_secret

KEY_BYTES = 20  # 160 bits, what authenticator apps expect for SHA-1 TOTP
RECOVERY_CODE_COUNT = 10
# What an unverified staff session may still reach: the code step and its set-up page,
# login, logout and password reset, and the API, whose session authentication answers 403
# `two_factor_required` itself (StaffVerifiedSessionAuthentication) instead of redirecting.
UNVERIFIED_STAFF_PATHS = ("/account/two-factor/", "/accounts/", "/api/", "/healthz/")
STAFF_SETUP_MESSAGE = (
    "Ops pages need two-factor sign-in: set up an authenticator app below to continue."
)
STAFF_VERIFY_MESSAGE = "Ops pages need this session verified: enter a code from your app."


def new_key() -> str:
    """A fresh TOTP secret, hex-encoded as TOTPDevice stores it."""
    return secrets.token_hex(KEY_BYTES)


def key_base32(key: str) -> str:
    """The secret as people type it into an app: base32, no padding."""
    return b32encode(unhexlify(key)).decode().rstrip("=")


def otpauth_uri(*, key: str, account: str) -> str:
    issuer = settings.OTP_TOTP_ISSUER
    label = quote(f"{issuer}:{account}")
    query = urlencode({"secret": key_base32(key), "issuer": issuer, "digits": 6, "period": 30})
    return f"otpauth://totp/{label}?{query}"


def qr_svg(uri: str) -> str:
    """The URI as an inline SVG QR code (made here: nothing leaves the server)."""
    return segno.make(uri, error="m").svg_inline(scale=4, border=2, dark="#000", light="#fff")


def new_recovery_code() -> str:
    # 10 characters of base32: 50 bits, typed once, refused after LOGIN_FAILURE_LIMIT tries.
    raw = b32encode(secrets.token_bytes(10)).decode().lower()[:10]
    return f"{raw[:5]}-{raw[5:]}"


def recovery_code_hash(*, user_id: int, code: str) -> str:
    normalized = code.strip().lower().replace(" ", "").replace("-", "")
    return hash_secret(f"{user_id}:{normalized}")


def looks_like_recovery_code(code: str) -> bool:
    return not code.strip().replace(" ", "").isdigit()


def totp_device(user: User | AnonymousUser) -> TOTPDevice | None:
    """The user's set-up (confirmed) TOTP device, if any."""
    if not getattr(user, "is_authenticated", False):
        return None
    return TOTPDevice.objects.filter(user=user, confirmed=True).first()


def has_two_factor(user: User | AnonymousUser) -> bool:
    return totp_device(user) is not None


def require_for_api_token(user: User) -> None:
    """Refuse a staff user's API token until that user has set up two-factor sign-in.

    A token is a password's equal: staff tokens would bypass the rule pages enforce."""
    if user.is_staff and not has_two_factor(user):
        raise NotAllowed(
            "Ops accounts must set up two-factor sign-in (/account/two-factor/) before "
            "their API tokens work.",
            code="two_factor_required",
        )


def unverified_staff(user: User | AnonymousUser) -> bool:
    """A signed-in staff account whose session has not passed the code step."""
    if not (user.is_authenticated and user.is_staff):
        return False
    verified = getattr(user, "is_verified", None)  # set on request.user by OTPMiddleware
    return not (callable(verified) and verified())


class StaffTwoFactorMiddleware:
    """Staff reach every page (ops pages, the admin, their account and token pages) only
    from a session verified by a second factor: without a device they are sent to set one
    up, with one (a session from before, or the admin's password form) to verify."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: PageRequest) -> HttpResponse:
        user = request.user
        if unverified_staff(user) and not request.path.startswith(UNVERIFIED_STAFF_PATHS):
            notice = STAFF_VERIFY_MESSAGE if has_two_factor(user) else STAFF_SETUP_MESSAGE
            messages.warning(request, notice)
            target = f"{reverse('tenants:two_factor')}?{urlencode({'next': request.path})}"
            if request.htmx:
                response = HttpResponse(status=204)
                response["HX-Redirect"] = target
                return response
            return redirect(target)
        return self.get_response(request)
