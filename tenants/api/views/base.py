"""What the tenants API's views share: a tenant's resources (members only, scoped to their
tenant), the caller's membership, and the Idempotency-Key of creates that cost money or
start work.

Every tenant resource reads through a `for_tenant` selector, so another tenant's object
is a 404. Writes call one service each; the services' errors become 400/403/409 in
gpuplatform/api/errors.py."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from drf_spectacular.utils import OpenApiParameter
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.views import APIView

from tenants.models import Membership, Tenant
from tenants.permissions import IsTenantMember, request_membership

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Repeat a create safely: the same key returns the first result (200) and "
    "charges or starts nothing again; the same key with a different body is a 409.",
)


def idempotency_key(request: Request) -> str:
    return request.headers.get("Idempotency-Key", "")


def membership_of(request: Request) -> Membership:
    """The caller's membership, behind IsTenantMember (which refuses a caller without one)."""
    membership = request_membership(request)
    if membership is None:  # a check, not an assert: `python -O` drops asserts
        raise PermissionDenied("IsTenantMember let a caller without a tenant through")
    return membership


# An APIView only for the type checker (it comes before the view's own bases, which hold
# APIView). Its docstring is the schema's description of a view without one of its own.
class TenantResourceMixin(APIView):
    """Members of a tenant; writes need a writing role (IsTenantMember)."""

    permission_classes = [IsAuthenticated, IsTenantMember]

    @property
    def tenant(self) -> Tenant | None:
        """The caller's tenant; None where no permission ran (the schema's generation)."""
        membership = request_membership(self.request)
        return membership.tenant if membership else None

    @property
    def membership(self) -> Membership:
        """The caller's membership, in a handler (the permissions ran)."""
        return membership_of(self.request)
