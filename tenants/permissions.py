"""Who may use what: the page decorator for tenant members and the API permissions by
tenant role. Object scoping itself is done by the querysets."""

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from rest_framework import permissions

from gpuplatform.api.permissions import IsOps

from .selectors import membership_for_user

__all__ = ["IsOps", "IsTenantMember", "member_required", "redact_for_viewers"]


def member_required(view):
    """A page for people in a tenant: signed in and a member; sets request.membership."""

    @wraps(view)
    @login_required
    def wrapper(request, *args, **kwargs):
        request.membership = membership_for_user(request.user)
        if request.membership is None:
            messages.info(request, "Create a tenant (or accept an invitation) first.")
            return redirect("tenants:account")
        return view(request, *args, **kwargs)

    return wrapper


class IsTenantMember(permissions.BasePermission):
    """The caller belongs to a tenant; writes need an active tenant and a writing role.

    Sets `request.membership` for the view.
    """

    message = "Join or create a tenant first."

    def has_permission(self, request, view) -> bool:
        membership = membership_for_user(request.user)
        request.membership = membership
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


def redact_for_viewers(data: dict, membership) -> dict:
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
