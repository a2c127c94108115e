"""The audit trail of a tenant's account (`audit_event_record`), and what its owners and
members are told by mail (`members_notify`, sent by the task through `members_notify_send`).
Every other tenants service writes its trail and its mail through these."""

from collections.abc import Mapping

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.mail import send_mail

from gpuplatform.dispatch import enqueue

from ..models import AuditEvent, Membership, Role, Tenant


def audit_event_record(
    *,
    tenant: Tenant,
    actor: User | AnonymousUser | None,
    action: str,
    summary: str,
    data: Mapping[str, object] | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        tenant=tenant,
        actor=actor if actor is not None and actor.is_authenticated else None,
        action=action,
        summary=summary[:300],
        data=data or {},
    )


def members_notify(*, tenant: Tenant, subject: str, body: str) -> None:
    """Email the tenant's owners and members (after commit): slice failures, time running out."""
    enqueue("tenants.notify_members", tenant.pk, subject[:150], body[:4000])


def members_notify_send(*, tenant_id: int, subject: str, body: str) -> int:
    emails = list(
        Membership.objects.filter(tenant_id=tenant_id, role__in=[Role.OWNER, Role.MEMBER])
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )
    if not emails:
        return 0
    send_mail(
        f"[gpuplatform] {subject}",
        body,
        settings.DEFAULT_FROM_EMAIL,
        emails,
    )
    return len(emails)
