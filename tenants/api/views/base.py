"""What the tenants API's views share: a tenant's resources (members only, scoped to their
tenant) and the Idempotency-Key of creates that cost money or start work.

Every tenant resource reads through a `for_tenant` selector, so another tenant's object
is a 404. Writes call one service each; the services' errors become 400/403/409 in
gpuplatform/api/errors.py."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter
from rest_framework.permissions import IsAuthenticated

from tenants.permissions import IsTenantMember

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Repeat a create safely: the same key returns the first result (200) and "
    "charges or starts nothing again; the same key with a different body is a 409.",
)


def idempotency_key(request) -> str:
    return request.headers.get("Idempotency-Key", "")


class TenantResourceMixin:
    """Members of a tenant; writes need a writing role (IsTenantMember)."""

    permission_classes = [IsAuthenticated, IsTenantMember]

    @property
    def tenant(self):
        membership = getattr(self.request, "membership", None)  # type: ignore[attr-defined]
        return membership.tenant if membership else None
