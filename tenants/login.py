"""Login with a limit on failed attempts per client address and account (the API has its
own), the two-factor second step, and where each kind of user lands."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods
from django_otp import login as otp_login

from gpuplatform.errors import ServiceError
from gpuplatform.http import client_address
from gpuplatform.pages import form_error

from . import form_limits, services, two_factor
from .forms.two_factor import CodeForm

WINDOW_S = 15 * 60
# Where ops (staff users) land after logging in when `next` names nowhere: their fleet.
OPS_LOGIN_REDIRECT_URL = "nodes:fleet"
# Password accepted, code awaited: what the session holds, and for how long it may wait.
PENDING_SESSION_KEY = "two_factor_pending"
PENDING_TTL_S = 5 * 60


def failure_key(request: HttpRequest, username: str) -> str:
    # Per address and account: guessing one account is slowed; others are unaffected.
    username = str(username)[:150].strip().lower()
    digest = hashlib.sha256(username.encode()).hexdigest()[:32]  # stable across processes
    return f"login-failures:{client_address(request)}:{digest}"


def is_locked(key: str) -> bool:
    return cache.get(key, 0) >= settings.LOGIN_FAILURE_LIMIT


def failure_record(key: str) -> None:
    cache.add(key, 0, WINDOW_S)
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, WINDOW_S)


def _landing(request: HttpRequest, user: User, next_url: str) -> str:
    if next_url and url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return next_url
    if user.is_staff:
        return resolve_url(OPS_LOGIN_REDIRECT_URL)
    return resolve_url(settings.LOGIN_REDIRECT_URL)


class ThrottledLoginView(auth_views.LoginView):
    """Past settings.FORM_RATE login POSTs from one address (tenants/form_limits.py), or
    past LOGIN_FAILURE_LIMIT failed logins (wrong passwords and wrong codes) for one
    account from one address in 15 minutes, further attempts are refused (429) unchecked.
    Someone with two-factor on is not logged in yet: the code step comes first."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # Every attempt counts against the address's form rate, whichever account it names.
        refused = form_limits.refusal(request, "login")
        if refused is not None:
            return refused
        if is_locked(failure_key(request, request.POST.get("username", ""))):
            return render(request, "registration/login_locked.html", status=429)
        return super().post(request, *args, **kwargs)

    def get_default_redirect_url(self) -> str:
        """Without a `next`: ops land on the fleet, everyone else on LOGIN_REDIRECT_URL."""
        if self.request.user.is_staff:
            return resolve_url(OPS_LOGIN_REDIRECT_URL)
        return super().get_default_redirect_url()

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        user = form.get_user()
        if not two_factor.has_two_factor(user):
            return super().form_valid(form)
        self.request.session[PENDING_SESSION_KEY] = {
            "user_id": user.pk,
            "backend": user.backend,
            "username": self.request.POST.get("username", ""),
            "next": self.get_redirect_url(),
            "at": time.time(),
        }
        return redirect("login_two_factor")

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        failure_record(failure_key(self.request, self.request.POST.get("username", "")))
        return super().form_invalid(form)


@require_http_methods(["GET", "POST"])
def login_two_factor(request: HttpRequest) -> HttpResponse:
    """The second step: the session is not signed in until a code from the app (or an
    unused recovery code) is accepted. Wrong codes count as failed logins."""
    pending = request.session.get(PENDING_SESSION_KEY)
    if not pending or time.time() - pending["at"] > PENDING_TTL_S:
        request.session.pop(PENDING_SESSION_KEY, None)
        return redirect("login")
    user = get_user_model().objects.filter(pk=pending["user_id"], is_active=True).first()
    if user is None:
        return redirect("login")
    key = failure_key(request, pending["username"])
    form = CodeForm(request.POST or None)
    if request.method == "POST":
        if is_locked(key):
            request.session.pop(PENDING_SESSION_KEY, None)
            return render(request, "registration/login_locked.html", status=429)
        if form.is_valid():
            try:
                device = services.two_factor_verify(user=user, code=form.cleaned_data["code"])
            except ServiceError as exc:  # a wrong code; counted like a wrong password
                failure_record(key)
                form_error(form, exc)
            else:
                del request.session[PENDING_SESSION_KEY]
                login(request, user, backend=pending["backend"])
                otp_login(request, device)
                return redirect(_landing(request, user, pending["next"]))
    status = 400 if form.errors else 200
    return render(request, "registration/login_two_factor.html", {"form": form}, status=status)
