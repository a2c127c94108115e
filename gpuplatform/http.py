"""The requests the platform's views receive, typed as its middleware and decorators leave
them: django-htmx's details on every request, a signed-in user behind the login and staff
decorators, the caller's membership behind `member_required` (or loaded by the account
pages themselves). Views annotate with these so the type checker knows what Django's own
`HttpRequest` cannot say."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails

if TYPE_CHECKING:  # the tenants app imports this module: no import at run time
    from tenants.models import Membership


def client_address(request: HttpRequest) -> str:
    """The caller's address, as every rate limit, lockout and token network check reads
    it. X-Forwarded-For counts only when settings say proxies stand in front
    (GPUPLATFORM_NUM_PROXIES, 0 by default) and, where GPUPLATFORM_TRUSTED_PROXIES lists
    them, only when the request came from one of those: then the address the nearest
    proxy saw (a client's own forged entries sit further left and are never read). With
    no proxy in front the header is the client's own words and is ignored."""
    remote = request.META.get("REMOTE_ADDR", "") or ""
    proxies = settings.REST_FRAMEWORK.get("NUM_PROXIES") or 0
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if not proxies or not forwarded:
        return remote
    if settings.TRUSTED_PROXIES and not _in_networks(remote, settings.TRUSTED_PROXIES):
        return remote
    addrs = [a.strip() for a in forwarded.split(",") if a.strip()]
    return addrs[-min(proxies, len(addrs))] if addrs else remote


def _in_networks(address: str, networks: list[str]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(n, strict=False) for n in networks)


class PageRequest(HttpRequest):
    """Any page's request: django-htmx's middleware sets `htmx` on every one."""

    htmx: HtmxDetails


class UserRequest(PageRequest):
    """A request behind `login_required` or `staff_member_required`: a real user."""

    user: User


class AccountRequest(UserRequest):
    """A signed-in user's request on a page that loads the membership itself (None before
    the user joins or creates a tenant), so the templates' context processor need not."""

    membership: Membership | None


class MemberRequest(UserRequest):
    """A request behind `tenants.permissions.member_required`: its membership is set."""

    membership: Membership


def signed_in(request: HttpRequest) -> User:
    """The user of a request that a permission refusing anonymous callers let through
    (an API view's IsAuthenticated, IsOps or IsTenantMember), where Django's and DRF's
    types still say the user may be anonymous."""
    user = request.user
    if not isinstance(user, User):  # a check, not an assert: `python -O` drops asserts
        raise PermissionDenied("an anonymous caller got past the view's permissions")
    return user
