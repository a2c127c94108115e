"""The Django admin behind the platform's one door: it has no login form of its own (a
password alone must never open it) and admits only staff whose session passed the code
step. Anyone else is sent to the platform's login, which asks for the code."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.urls import reverse


class PlatformAdminSite(admin.AdminSite):
    site_header = "gpuplatform ops admin"
    site_title = "gpuplatform admin"

    def has_permission(self, request: HttpRequest) -> bool:
        verified = getattr(request.user, "is_verified", None)  # set by OTPMiddleware
        return super().has_permission(request) and callable(verified) and bool(verified())

    def login(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # GET or POST alike: no password is checked here, so no second door without a
        # code step and without the login's failure counting.
        target = request.GET.get("next") or reverse("admin:index")
        return redirect_to_login(target, login_url=reverse("login"))
