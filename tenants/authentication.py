"""API token authentication: `Authorization: Bearer gpp_...`, looked up by its hash.

Failed attempts are counted per client address: past the `auth_failure` rate every
further attempt from that address gets 429 before any token is checked, so tokens
cannot be guessed at speed.

A live token is then held to its client networks and scopes (gpuplatform/api/scopes.py)
here, the one place every token request passes, whatever permission classes a view lists.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import TYPE_CHECKING, TypedDict

from django.contrib.auth.models import User
from django.db.models import OuterRef, Subquery
from django.utils import timezone
from rest_framework import authentication, exceptions, throttling
from rest_framework.settings import api_settings

from gpuplatform.api.scopes import IpNotAllowed, address_allowed, check_scope, role_scopes
from gpuplatform.errors import NotAllowed
from gpuplatform.http import client_address

from .models import ApiToken, Membership
from .tokens import hash_secret
from .two_factor import require_for_api_token, unverified_staff

if TYPE_CHECKING:  # annotations only: DRF loads this module while rest_framework.views loads
    from django_stubs_ext import WithAnnotations
    from rest_framework.request import Request
    from rest_framework.views import APIView


class _Role(TypedDict):
    role: str | None  # the token's user's role in their tenant (None: no tenant)


LAST_USED_RESOLUTION = timedelta(minutes=1)

MALFORMED_HEADER = "Invalid Authorization header: expected 'Bearer <token>'."
TOKEN_REFUSED = "Invalid, expired or revoked token."  # noqa: S105 - a message, not a secret


class AuthFailureThrottle(throttling.SimpleRateThrottle):
    scope = "auth_failure"
    # Set by SimpleRateThrottle.__init__ from the rate (its stubs leave them out); read only
    # when a rate is set.
    num_requests: int
    duration: int

    def get_rate(self) -> str | None:
        # DRF's rates are "N/period" strings; its stubs type them as numbers.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)  # type: ignore[return-value]

    def get_ident(self, request: Request) -> str:
        return client_address(request)

    def get_cache_key(self, request: Request, view: APIView | None) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def _load(self, request: Request) -> None:
        self.key = self.get_cache_key(request, None)
        self.history = self.cache.get(self.key, [])
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()

    def check(self, request: Request) -> None:
        if self.rate is None:
            return
        self._load(request)
        if len(self.history) >= self.num_requests:
            raise exceptions.Throttled(wait=self.wait())

    def record_failure(self, request: Request) -> None:
        if self.rate is None:
            return
        self._load(request)
        self.history.insert(0, self.now)
        self.cache.set(self.key, self.history, self.duration)


TWO_FACTOR_SESSION = (
    "Staff sessions reach the API only after the code step: sign in again at "
    "/accounts/login/ and enter a code from your app."
)


class StaffVerifiedSessionAuthentication(authentication.SessionAuthentication):
    """The browser session, as DRF reads it (with its CSRF check), refused for staff whose
    session never passed the code step: the API is no side door around the pages' rule."""

    def authenticate(self, request: Request) -> tuple[User, None] | None:
        found = super().authenticate(request)
        if found is not None and unverified_staff(request._request.user):
            raise NotAllowed(TWO_FACTOR_SESSION, code="two_factor_required")
        return found


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode(errors="replace") not in self.keywords:
            return None
        throttle = AuthFailureThrottle()
        throttle.check(request)
        try:
            token = self._authenticate(header)
        except exceptions.AuthenticationFailed:
            throttle.record_failure(request)
            raise
        require_for_api_token(token.user)  # staff: 403 two_factor_required until set up
        address = throttle.get_ident(request)
        if not address_allowed(networks=list(token.allowed_networks), address=address):
            raise IpNotAllowed()
        self._record_use(token, address)
        # Checked at use, against the role now: a user demoted since keeps a weaker token.
        allows = role_scopes(is_staff=token.user.is_staff, role=token.role)
        granted = set(token.scopes) & allows
        view = (getattr(request, "parser_context", None) or {}).get("view")
        assert request.method is not None  # a request Django serves always has one
        check_scope(granted=granted, view=view, method=request.method, role_allows=allows)
        return token.user, token

    def _record_use(self, token: ApiToken, address: str | None) -> None:
        # Writing on every call would turn each read into a write: once a minute, or when
        # the address changes.
        now = timezone.now()
        try:
            ipaddress.ip_address(address or "")
        except ValueError:
            address = None
        stale = token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION
        if stale or address != token.last_used_address:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now, last_used_address=address)

    def _authenticate(self, header: list[bytes]) -> WithAnnotations[ApiToken, _Role]:
        # Two answers, never more: a header that is not `Bearer <token>` is malformed; a
        # well-formed token that matches no live token (unknown, expired, revoked, or its
        # member removed) is refused without saying which, so nothing is learnt by trying.
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(MALFORMED_HEADER)
        try:
            value = header[1].decode("ascii")
        except UnicodeDecodeError as exc:  # no token we make is anything but ASCII
            raise exceptions.AuthenticationFailed(MALFORMED_HEADER) from exc
        role = Membership.objects.filter(user=OuterRef("user")).values("role")[:1]
        token = (
            ApiToken.objects.live()
            .select_related("user")
            .annotate(role=Subquery(role))
            .filter(key_hash=hash_secret(value))
            .first()
        )
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed(TOKEN_REFUSED)
        return token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'
