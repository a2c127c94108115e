"""The tenants app's models, by sub-domain: accounts (tenants, people, tokens, SSH keys, audit,
two-factor recovery codes), billing (tiers, purchases, credit, metering), slices, their runs
and volumes, and the images renters bring (registry rules and credentials)."""

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
from .billing import (
    CreditRate,
    CreditRequest,
    LedgerEntry,
    Purchase,
    StoragePrice,
    Tier,
    UsageRecord,
)
from .registries import RegistryCredential, RegistryMode, RegistryRule, RegistryRuleChange
from .runs import SliceRun
from .slices import Image, Slice, SliceLogLine, SliceTransition
from .templates import LaunchTemplate
from .two_factor import RecoveryCode
from .volumes import SliceMount, Volume

__all__ = [
    "ApiToken",
    "ApiTokenQuerySet",
    "AuditEvent",
    "CreditRate",
    "CreditRequest",
    "Image",
    "Invitation",
    "LaunchTemplate",
    "LedgerEntry",
    "Membership",
    "Purchase",
    "RecoveryCode",
    "RegistryCredential",
    "RegistryMode",
    "RegistryRule",
    "RegistryRuleChange",
    "Role",
    "Slice",
    "SliceLogLine",
    "SliceMount",
    "SliceRun",
    "SliceTransition",
    "SshKey",
    "StoragePrice",
    "Tenant",
    "TenantQuerySet",
    "TenantScopedQuerySet",
    "Tier",
    "UsageRecord",
    "Volume",
]
