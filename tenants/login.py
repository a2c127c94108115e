"""Login with a limit on failed attempts per client address (the API has its own), and
where each kind of user lands: ops on the fleet, tenants on their account page."""

import hashlib

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url

WINDOW_S = 15 * 60
# Where ops (staff users) land after logging in when `next` names nowhere: their fleet.
OPS_LOGIN_REDIRECT_URL = "nodes:fleet"


def client_address(request: HttpRequest) -> str:
    """The caller's address: behind N trusted proxies, the one the nearest proxy saw
    (what the API's throttles use too), so one client cannot lock out everyone."""
    proxies = settings.REST_FRAMEWORK.get("NUM_PROXIES") or 0
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if proxies and forwarded:
        addrs = [a.strip() for a in forwarded.split(",") if a.strip()]
        if addrs:
            return addrs[-min(proxies, len(addrs))]
    return request.META.get("REMOTE_ADDR", "")


def _key(request: HttpRequest) -> str:
    # Per address and account: guessing one account is slowed; others are unaffected.
    username = str(request.POST.get("username", ""))[:150].strip().lower()
    digest = hashlib.sha256(username.encode()).hexdigest()[:32]  # stable across processes
    return f"login-failures:{client_address(request)}:{digest}"


class ThrottledLoginView(auth_views.LoginView):
    """Past LOGIN_FAILURE_LIMIT failed logins for one account from one address in 15
    minutes, further attempts are refused (429) without checking the password."""

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:  # type: ignore[no-untyped-def]
        if cache.get(_key(request), 0) >= settings.LOGIN_FAILURE_LIMIT:
            return render(request, "registration/login_locked.html", status=429)
        return super().post(request, *args, **kwargs)

    def get_default_redirect_url(self) -> str:
        """Without a `next`: ops land on the fleet, everyone else on LOGIN_REDIRECT_URL."""
        if self.request.user.is_staff:
            return resolve_url(OPS_LOGIN_REDIRECT_URL)
        return super().get_default_redirect_url()

    def form_invalid(self, form):  # type: ignore[no-untyped-def]
        key = _key(self.request)
        cache.add(key, 0, WINDOW_S)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, WINDOW_S)
        return super().form_invalid(form)
