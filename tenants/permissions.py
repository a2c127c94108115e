"""API permissions by tenant role. Object scoping itself is done by the querysets."""

from rest_framework import permissions

from gpuplatform.api.permissions import IsOps

__all__ = ["IsOps", "IsTenantMember"]

from .selectors import membership_for_user


class IsTenantMember(permissions.BasePermission):
    """The caller belongs to a tenant; writes need an active tenant and a writing role.

    Sets `request.membership` for the view.
    """

    message = "Join or create a tenant first."

    def has_permission(self, request, view) -> bool:  # type: ignore[no-untyped-def]
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
