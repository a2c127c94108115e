"""The two-factor page (/account/two-factor/): set up an authenticator app, see recovery
codes once, regenerate them, verify this session, turn two-factor off (tenants only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_otp import login as otp_login

from gpuplatform.http import UserRequest
from gpuplatform.pages import submit

from .. import services, two_factor
from ..forms.two_factor import CodeForm
from ..login import failure_key, failure_record, is_locked
from ..services.two_factor import WrongCode

SETUP_KEY_SESSION_KEY = "two_factor_setup_key"
LOCKED = "Too many wrong codes: try again in 15 minutes."

T = TypeVar("T")


def _next(request: HttpRequest) -> str:
    """Where the page sends people on (an ops page they were turned away from)."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return ""


def _page(request: UserRequest, status: int = 200, **extra: Any) -> HttpResponse:
    device = two_factor.totp_device(request.user)
    context = {
        "device": device,
        "next": _next(request),
        "verified": request.user.is_verified(),  # type: ignore[attr-defined]  # OTPMiddleware adds it
        "form": extra.pop("form", None) or CodeForm(),
        **extra,
    }
    if device is None:
        # The secret waits in the session, not the database, until a code confirms it.
        key = request.session.get(SETUP_KEY_SESSION_KEY) or two_factor.new_key()
        request.session[SETUP_KEY_SESSION_KEY] = key
        uri = two_factor.otpauth_uri(key=key, account=request.user.get_username())
        context.update(
            secret=two_factor.key_base32(key), otpauth_uri=uri, qr=two_factor.qr_svg(uri)
        )
    return render(request, "tenants/two_factor.html", context, status=status)


def _with_code(request: UserRequest, action: Callable[[str], T]) -> T | HttpResponse:
    """The POST-and-verify step every code-guarded action takes: `action(code)` (one service
    call) for a posted code, through the pages' form-POST step; a wrong code counts as a
    failed login. Returns what `action` returned, or the page again with the form's error
    (which the caller answers with)."""
    form = CodeForm(request.POST)
    key = failure_key(request, request.user.get_username())
    if is_locked(key):
        form.is_valid()
        form.add_error(None, LOCKED)
        return _page(request, status=429, form=form)

    def counted(data: dict[str, Any]) -> T:
        try:
            return action(data["code"])
        except WrongCode:
            failure_record(key)
            raise

    posted = submit(request, form, counted)
    if not posted.done:
        return _page(request, status=posted.status, form=form)
    return posted.result


@login_required
@require_GET
def two_factor_page(request: UserRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_POST
def two_factor_enable(request: UserRequest) -> HttpResponse:
    key = request.session.get(SETUP_KEY_SESSION_KEY)
    if not key:
        return redirect("tenants:two_factor")
    codes = _with_code(
        request,
        lambda code: services.two_factor_enable(
            user=request.user, key=key, code=code, keep_session_key=request.session.session_key
        ),
    )
    if isinstance(codes, HttpResponse):
        return codes
    request.session.pop(SETUP_KEY_SESSION_KEY, None)
    # The code just typed proves the app: this session counts as verified.
    otp_login(request, two_factor.totp_device(request.user))
    messages.success(
        request,
        "Two-factor sign-in is on. Your other sessions are signed out and API tokens made "
        "before are revoked: make new ones.",
    )
    return _page(request, recovery_codes=codes)


@login_required
@require_POST
def two_factor_verify(request: UserRequest) -> HttpResponse:
    device = _with_code(
        request, lambda code: services.two_factor_verify(user=request.user, code=code)
    )
    if isinstance(device, HttpResponse):
        return device
    otp_login(request, device)
    messages.success(request, "This session is verified.")
    return redirect(_next(request) or "tenants:two_factor")


@login_required
@require_POST
def recovery_codes_regenerate(request: UserRequest) -> HttpResponse:
    codes = _with_code(
        request, lambda code: services.recovery_codes_regenerate(user=request.user, code=code)
    )
    if isinstance(codes, HttpResponse):
        return codes
    messages.success(request, "New recovery codes: the old ones no longer work.")
    return _page(request, recovery_codes=codes)


@login_required
@require_POST
def two_factor_disable(request: UserRequest) -> HttpResponse:
    refused = _with_code(
        request, lambda code: services.two_factor_disable(user=request.user, code=code)
    )
    if isinstance(refused, HttpResponse):
        return refused
    messages.success(request, "Two-factor sign-in is off.")
    return redirect("tenants:two_factor")
