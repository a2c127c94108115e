"""The two-factor page (/account/two-factor/): set up an authenticator app, see recovery
codes once, regenerate them, verify this session, turn two-factor off (tenants only)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_otp import login as otp_login

from gpuplatform.errors import ServiceError
from gpuplatform.pages import form_error

from .. import services, two_factor
from ..forms.two_factor import CodeForm
from ..login import failure_key, failure_record, is_locked
from ..services.two_factor import WrongCode

SETUP_KEY_SESSION_KEY = "two_factor_setup_key"
LOCKED = "Too many wrong codes: try again in 15 minutes."


def _next(request: HttpRequest) -> str:
    """Where the page sends people on (an ops page they were turned away from)."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return ""


def _page(request: HttpRequest, status: int = 200, **extra) -> HttpResponse:
    device = two_factor.totp_device(request.user)
    context = {
        "device": device,
        "next": _next(request),
        "verified": request.user.is_verified(),
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


def _with_code(request: HttpRequest, action):
    """Run `action(code)` for a posted code; a wrong one counts as a failed login.
    Returns (result, None) or (None, the page with the form's error)."""
    form = CodeForm(request.POST)
    key = failure_key(request, request.user.get_username())
    if is_locked(key):
        form.is_valid()
        form.add_error(None, LOCKED)
        return None, _page(request, status=429, form=form)
    if not form.is_valid():
        return None, _page(request, status=400, form=form)
    try:
        return action(form.cleaned_data["code"]), None
    except ServiceError as exc:
        if isinstance(exc, WrongCode):
            failure_record(key)
        form_error(form, exc)
        return None, _page(request, status=exc.status_code, form=form)


@login_required
@require_GET
def two_factor_page(request: HttpRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_POST
def two_factor_enable(request: HttpRequest) -> HttpResponse:
    key = request.session.get(SETUP_KEY_SESSION_KEY)
    if not key:
        return redirect("tenants:two_factor")
    codes, refused = _with_code(
        request,
        lambda code: services.two_factor_enable(user=request.user, key=key, code=code),
    )
    if refused:
        return refused
    request.session.pop(SETUP_KEY_SESSION_KEY, None)
    # The code just typed proves the app: this session counts as verified.
    otp_login(request, two_factor.totp_device(request.user))
    messages.success(request, "Two-factor sign-in is on.")
    return _page(request, recovery_codes=codes)


@login_required
@require_POST
def two_factor_verify(request: HttpRequest) -> HttpResponse:
    device, refused = _with_code(
        request, lambda code: services.two_factor_verify(user=request.user, code=code)
    )
    if refused:
        return refused
    otp_login(request, device)
    messages.success(request, "This session is verified.")
    return redirect(_next(request) or "tenants:two_factor")


@login_required
@require_POST
def recovery_codes_regenerate(request: HttpRequest) -> HttpResponse:
    codes, refused = _with_code(
        request, lambda code: services.recovery_codes_regenerate(user=request.user, code=code)
    )
    if refused:
        return refused
    messages.success(request, "New recovery codes: the old ones no longer work.")
    return _page(request, recovery_codes=codes)


@login_required
@require_POST
def two_factor_disable(request: HttpRequest) -> HttpResponse:
    _, refused = _with_code(
        request, lambda code: services.two_factor_disable(user=request.user, code=code)
    )
    if refused:
        return refused
    messages.success(request, "Two-factor sign-in is off.")
    return redirect("tenants:two_factor")
