"""Reads for views, API and tasks: one query shape each, scoped to a tenant or user."""

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Q, QuerySet

from .models import ApiToken, AuditEvent, Invitation, Membership, Tenant, Tier


def membership_for_user(user: AbstractBaseUser) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.select_related("tenant").filter(user=user).first()


def tier_list(*, active_only: bool = True) -> QuerySet[Tier]:
    qs = Tier.objects.all()
    return qs.filter(is_active=True) if active_only else qs


def member_list(*, tenant: Tenant | None) -> QuerySet[Membership]:
    return Membership.objects.for_tenant(tenant).select_related("user").order_by("user__email")


def invitation_pending_list(*, tenant: Tenant | None) -> QuerySet[Invitation]:
    return (
        Invitation.objects.for_tenant(tenant)
        .filter(accepted_at__isnull=True, revoked_at__isnull=True)
        .select_related("invited_by")
        .order_by("-created_at")
    )


def api_token_list(*, user: AbstractBaseUser) -> QuerySet[ApiToken]:
    """A user's own tokens: tokens are personal, so they are scoped by user, not tenant."""
    if not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def audit_event_list(*, tenant: Tenant | None, limit: int = 20) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.for_tenant(tenant).select_related("actor")[:limit]


def tenant_list_for_ops(*, search: str = "", status: str = "") -> QuerySet[Tenant]:
    qs = Tenant.objects.annotate(member_count=Count("memberships", distinct=True)).order_by(
        "name", "pk"
    )
    if search:
        qs = qs.filter(
            Q(name__icontains=search)
            | Q(slug__icontains=search)
            | Q(memberships__user__email__icontains=search)
        ).distinct()
    if status:
        qs = qs.filter(status=status)
    return qs
