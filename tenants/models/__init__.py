"""The tenants app's models, by sub-domain: accounts (tenants, people, tokens, SSH keys, audit),
billing (tiers, purchases, credit, metering) and slices (launches and images)."""

from .accounts import (
    ApiToken,
    ApiTokenQuerySet,
    AuditEvent,
    Invitation,
    Membership,
    Role,
    SshKey,
    Tenant,
    TenantQuerySet,
    TenantScopedQuerySet,
)
from .billing import CreditRate, CreditRequest, LedgerEntry, Purchase, Tier, UsageRecord
from .slices import Image, Slice, SliceTransition

__all__ = [
    "ApiToken",
    "ApiTokenQuerySet",
    "AuditEvent",
    "CreditRate",
    "CreditRequest",
    "Image",
    "Invitation",
    "LedgerEntry",
    "Membership",
    "Purchase",
    "Role",
    "Slice",
    "SliceTransition",
    "SshKey",
    "Tenant",
    "TenantQuerySet",
    "TenantScopedQuerySet",
    "Tier",
    "UsageRecord",
]
