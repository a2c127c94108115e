"""Who may use what: the page decorator for tenant members and the API permissions by
tenant role. Object scoping itself is done by the querysets."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, cast

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http.response import HttpResponseBase
from django.shortcuts import redirect
from rest_framework import permissions

from gpuplatform.api.permissions import IsOps
from gpuplatform.http import MemberRequest, UserRequest

from .selectors import membership_for_user

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView

    from .models import Membership

P = ParamSpec("P")

__all__ = [
    "IsOps",
    "IsTenantMember",
    "member_required",
    "redact_for_viewers",
    "request_membership",
]


def member_required(
    view: Callable[Concatenate[MemberRequest, P], HttpResponseBase],
) -> Callable[Concatenate[UserRequest, P], HttpResponseBase]:
    """A page for people in a tenant: signed in and a member; sets request.membership."""

    @wraps(view)
    @login_required
    def wrapper(request: UserRequest, /, *args: P.args, **kwargs: P.kwargs) -> HttpResponseBase:
        membership = membership_for_user(request.user)
        if membership is None:
            messages.info(request, "Create a tenant (or accept an invitation) first.")
            return redirect("tenants:account")
        member = cast(MemberRequest, request)  # the same request, now with its membership
        member.membership = membership
        return view(member, *args, **kwargs)

    return wrapper


def request_membership(request: Request) -> Membership | None:
    """The membership IsTenantMember found for an API request (None: the caller has no
    tenant, or the view does not list IsTenantMember)."""
    membership: Membership | None = getattr(request, "membership", None)
    return membership


class IsTenantMember(permissions.BasePermission):
    """The caller belongs to a tenant; writes need an active tenant and a writing role.

    Sets `request.membership` for the view.
    """

    message = "Join or create a tenant first."

    def has_permission(self, request: Request, view: APIView) -> bool:
        membership = membership_for_user(request.user)
        # Kept on the request for the view (request_membership reads it back).
        request.membership = membership  # type: ignore[attr-defined]  # set on purpose
        if membership is None:
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        if not membership.tenant.is_active:
            self.message = "This tenant is suspended: nothing can be changed."
            return False
        if not membership.can_write:
            self.message = "Your role in this tenant is read-only."
            return False
        return True


def redact_for_viewers(data: dict[str, Any], membership: Membership | None) -> dict[str, Any]:
    """Viewers see a slice, not its keys: the Jupyter token (and URL carrying it) and
    environment values, which often hold secrets, are only for members who can write."""
    if membership is None or membership.can_write:
        return data
    connection = dict(data.get("connection") or {})
    for key in ("token", "url"):
        if key in connection:
            connection[key] = "(hidden from viewers)"
    data["connection"] = connection
    if data.get("environment"):
        data["environment"] = dict.fromkeys(data["environment"], "(hidden)")
    return data
