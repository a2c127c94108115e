"""Reads of tenants, people, invitations, API tokens, SSH keys and the audit trail."""

from __future__ import annotations

import logging
from pathlib import Path

import paramiko
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from nodes import ssh as node_ssh

from ..models import ApiToken, AuditEvent, Invitation, Membership, SshKey, Tenant
from ..tokens import hash_secret

logger = logging.getLogger(__name__)


def membership_for_user(user: User | AnonymousUser) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.select_related("tenant").filter(user=user).first()


def member_list(*, tenant: Tenant | None) -> QuerySet[Membership]:
    return Membership.objects.for_tenant(tenant).select_related("user").order_by("user__email")


def invitation_pending_list(*, tenant: Tenant | None) -> QuerySet[Invitation]:
    return (
        Invitation.objects.for_tenant(tenant)
        .filter(accepted_at__isnull=True, revoked_at__isnull=True)
        .select_related("invited_by")
        .order_by("-created_at")
    )


def invitation_by_token(token: str) -> Invitation | None:
    """The pending, unexpired invitation this link's token opens, or None."""
    return (
        Invitation.objects.select_related("tenant")
        .filter(
            token_hash=hash_secret(token),
            accepted_at__isnull=True,
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
        .first()
    )


# Tokens made by tokens make a short chain in practice; the bounds keep a walk finite.
TOKEN_LINEAGE_MAX = 64
TOKEN_TREE_MAX = 10_000


def api_token_list(*, user: User | AnonymousUser) -> QuerySet[ApiToken]:
    """A user's own tokens: tokens are personal, so they are scoped by user, not tenant."""
    if not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def api_token_lineage(token: ApiToken) -> list[ApiToken]:
    """The token, then the token that made it, and so on up: each bounds the ones below."""
    chain = [token]
    while chain[-1].parent_id is not None and len(chain) < TOKEN_LINEAGE_MAX:
        parent = ApiToken.objects.filter(pk=chain[-1].parent_id).first()
        if parent is None:
            break
        chain.append(parent)
    return chain


def api_token_descendant_ids(token: ApiToken) -> list[int]:
    """The token's id and those of every token made from it, at any depth."""
    ids, frontier = [token.pk], [token.pk]
    while frontier and len(ids) < TOKEN_TREE_MAX:
        frontier = list(
            ApiToken.objects.filter(parent_id__in=frontier).values_list("pk", flat=True)
        )
        ids.extend(frontier)
    return ids


def ssh_keys_of(user: User | AnonymousUser) -> QuerySet[SshKey]:
    """A user's own SSH keys, newest first: keys are personal, scoped by user like tokens."""
    if not user.is_authenticated:
        return SshKey.objects.none()
    return SshKey.objects.filter(user=user).order_by("-created_at", "-id")


def ssh_key_owner(*, fingerprint: str) -> tuple[SshKey, User] | None:
    """For the gateway: the key with this OpenSSH SHA256 fingerprint and the person it
    signs in, or None (no such key, or the account is deactivated). Which slices they may
    reach is the gateway's call, from their membership."""
    key = (
        SshKey.objects.select_related("user")
        .filter(fingerprint=fingerprint, user__is_active=True)
        .first()
    )
    return (key, key.user) if key is not None else None


def gateway_host_key_fingerprint() -> str:
    """The SHA256 fingerprint of the gateway's host key, the one renters pin. The key is
    made on first use and kept in GATEWAY_HOST_KEY_PATH, the file the gateway serves, so
    whichever of the two starts first makes it. "" when it cannot be read or made (the
    page then says so rather than fail)."""
    path = Path(settings.GATEWAY_HOST_KEY_PATH)
    for _attempt in range(2):
        try:
            return node_ssh.fingerprint(node_ssh.load_or_create_platform_key(path))
        except FileExistsError:
            continue  # the gateway made it a moment ago: read theirs
        except (OSError, paramiko.SSHException) as exc:
            logger.warning("gateway host key at %s unusable: %s", path, exc)
            return ""
    return ""


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
