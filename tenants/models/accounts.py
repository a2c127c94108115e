"""Tenants and their people: members, invitations, API tokens, SSH keys, the audit trail.

Every tenant-owned model's manager has `for_tenant(tenant)`: views, API and selectors
read through it, so another tenant's object is simply not found (404).
"""

from decimal import Decimal
from typing import TYPE_CHECKING, Self

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class TenantScopedQuerySet(models.QuerySet):
    tenant_field = "tenant"

    def for_tenant(self, tenant: "Tenant | None") -> Self:
        if tenant is None:
            return self.none()
        return self.filter(**{self.tenant_field: tenant})


class TenantQuerySet(models.QuerySet):
    def visible_to(self, user: "User | AnonymousUser") -> Self:
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self.all()
        return self.filter(memberships__user=user)


class Tenant(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "active"
        SUSPENDED = "suspended", "suspended"

    name = models.CharField("name", max_length=100)
    slug = models.SlugField("slug", max_length=110, unique=True)
    status = models.CharField(
        "status", max_length=16, choices=Status.choices, default=Status.ACTIVE
    )
    status_reason = models.CharField("status reason", max_length=500, blank=True)
    credit_balance = models.DecimalField(
        "credit balance", max_digits=12, decimal_places=2, default=Decimal("0.00")
    )
    spend_limit = models.DecimalField(
        "monthly spend limit (credits)",
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="At 80% members are warned; at 100% purchases, launches and resumes are refused.",
    )
    created_at = models.DateTimeField("created", auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = "tenant"
        constraints = [
            models.CheckConstraint(
                condition=Q(credit_balance__gte=0),
                name="%(app_label)s_%(class)s_balance_non_negative",
                violation_error_message="The credit balance cannot go below zero.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE


class Role(models.TextChoices):
    OWNER = "owner", "owner"
    MEMBER = "member", "member"
    VIEWER = "viewer", "viewer"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memberships",
        verbose_name="user",
    )
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        related_name="memberships",
        verbose_name="tenant",
    )
    role = models.CharField("role", max_length=16, choices=Role.choices, default=Role.MEMBER)
    spend_limit = models.DecimalField(
        "monthly spend limit (credits)",
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="What this member may buy in a calendar month (UTC).",
    )
    created_at = models.DateTimeField("joined", auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "user__email"]
        verbose_name = "membership"
        constraints = [
            models.CheckConstraint(
                condition=Q(role__in=["owner", "member", "viewer"]),
                name="%(app_label)s_%(class)s_role_known",
                violation_error_message="Unknown role.",
            ),
            # One account belongs to one tenant: every request then has one scope.
            models.UniqueConstraint(
                fields=["user"],
                name="%(app_label)s_%(class)s_one_tenant_per_user",
                violation_error_message="This user already belongs to a tenant.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.role}) in {self.tenant}"

    @property
    def can_manage(self) -> bool:
        return self.role == Role.OWNER

    @property
    def can_write(self) -> bool:
        return self.role in (Role.OWNER, Role.MEMBER)


class Invitation(models.Model):
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        related_name="invitations",
        verbose_name="tenant",
    )
    email = models.EmailField("email")
    role = models.CharField("role", max_length=16, choices=Role.choices, default=Role.MEMBER)
    # Set when the email goes out: the link's token exists only in that email.
    token_hash = models.CharField("token hash", max_length=64, unique=True, null=True, blank=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="invitations_sent",
        verbose_name="invited by",
    )
    created_at = models.DateTimeField("created", auto_now_add=True)
    expires_at = models.DateTimeField("expires")
    sent_at = models.DateTimeField("email sent", null=True, blank=True)
    accepted_at = models.DateTimeField("accepted", null=True, blank=True)
    revoked_at = models.DateTimeField("revoked", null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "invitation"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "email"],
                condition=Q(accepted_at__isnull=True, revoked_at__isnull=True),
                name="%(app_label)s_%(class)s_one_pending_per_email",
                violation_error_message="This address already has a pending invitation.",
            ),
            models.CheckConstraint(
                condition=Q(role__in=["owner", "member", "viewer"]),
                name="%(app_label)s_%(class)s_role_known",
                violation_error_message="Unknown role.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.email} -> {self.tenant}"


class ApiTokenQuerySet(TenantScopedQuerySet):
    def live(self) -> Self:
        return self.filter(revoked_at__isnull=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        )


class ApiToken(models.Model):
    """A bearer token for automation. Only its SHA-256 is stored; the value is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="api_tokens",
        verbose_name="user",
    )
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        related_name="api_tokens",
        null=True,
        blank=True,
        verbose_name="tenant",
        help_text="The tenant the user belonged to when the token was made; empty for ops.",
    )
    name = models.CharField("name", max_length=64)
    prefix = models.CharField(
        "prefix", max_length=16, help_text="The token's first characters, to recognise it."
    )
    key_hash = models.CharField("key hash (SHA-256)", max_length=64, unique=True)
    created_at = models.DateTimeField("created", auto_now_add=True)
    expires_at = models.DateTimeField("expires", null=True, blank=True)
    spend_limit = models.DecimalField(
        "monthly spend limit (credits)",
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="What this token may buy in a calendar month (UTC).",
    )
    scopes = models.JSONField(
        "scopes",
        default=list,
        blank=True,
        help_text="What the token may do: read, launch, billing, admin.",
    )
    allowed_networks = models.JSONField(
        "allowed client networks",
        default=list,
        blank=True,
        help_text="CIDR networks the token may be used from; empty: anywhere.",
    )
    last_used_at = models.DateTimeField("last used", null=True, blank=True)
    last_used_address = models.GenericIPAddressField("last used from", null=True, blank=True)
    revoked_at = models.DateTimeField("revoked", null=True, blank=True)
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        related_name="children",
        null=True,
        blank=True,
        verbose_name="made by token",
        help_text="The token that made this one: it bounds this one's expiry, scopes, "
        "networks and spending, and revoking it revokes this one.",
    )

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__isnull=True) | Q(expires_at__gt=F("created_at")),
                name="%(app_label)s_%(class)s_expires_after_created",
                violation_error_message="A token must expire after it was created.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_live(self) -> bool:
        return self.revoked_at is None and (
            self.expires_at is None or self.expires_at > timezone.now()
        )


class SshKey(models.Model):
    """A public key a person signs in to the SSH gateway with.

    Keys belong to the person, not to a tenant: the gateway finds the person by the key's
    fingerprint, then decides from their membership which slices they may reach. So a
    key is registered by one account only (the fingerprint is unique across users).
    """

    class KeyType(models.TextChoices):
        ED25519 = "ssh-ed25519", "Ed25519"
        ECDSA_256 = "ecdsa-sha2-nistp256", "ECDSA P-256"
        ECDSA_384 = "ecdsa-sha2-nistp384", "ECDSA P-384"
        ECDSA_521 = "ecdsa-sha2-nistp521", "ECDSA P-521"
        RSA = "ssh-rsa", "RSA"
        SK_ED25519 = "sk-ssh-ed25519@openssh.com", "Ed25519 security key"
        SK_ECDSA_256 = "sk-ecdsa-sha2-nistp256@openssh.com", "ECDSA P-256 security key"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="ssh_keys",
        verbose_name="user",
    )
    name = models.CharField("name", max_length=64)
    key_type = models.CharField("type", max_length=64, choices=KeyType.choices)
    public_key = models.TextField(
        "public key", help_text="The normalised single line `<type> <base64>`, no comment."
    )
    comment = models.CharField(
        "comment", max_length=200, blank=True, help_text="The comment the pasted line ended with."
    )
    fingerprint = models.CharField(
        "fingerprint", max_length=64, help_text="OpenSSH SHA256 form: SHA256:<base64>."
    )
    created_at = models.DateTimeField("added", auto_now_add=True)
    last_used_at = models.DateTimeField("last used", null=True, blank=True)
    last_used_address = models.GenericIPAddressField("last used from", null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "SSH key"
        constraints = [
            # Also what keeps a user from adding the same key twice.
            models.UniqueConstraint(
                fields=["fingerprint"],
                name="%(app_label)s_%(class)s_one_account_per_key",
                violation_error_message="This key is already registered.",
            ),
            models.CheckConstraint(
                condition=~Q(name=""),
                name="%(app_label)s_%(class)s_name_not_blank",
                violation_error_message="Give the key a name.",
            ),
            models.CheckConstraint(
                condition=Q(fingerprint__startswith="SHA256:"),
                name="%(app_label)s_%(class)s_fingerprint_sha256",
                violation_error_message="The fingerprint is the key's SHA256 form.",
            ),
            models.CheckConstraint(
                condition=Q(
                    key_type__in=[
                        "ssh-ed25519",
                        "ecdsa-sha2-nistp256",
                        "ecdsa-sha2-nistp384",
                        "ecdsa-sha2-nistp521",
                        "ssh-rsa",
                        "sk-ssh-ed25519@openssh.com",
                        "sk-ecdsa-sha2-nistp256@openssh.com",
                    ]
                ),
                name="%(app_label)s_%(class)s_type_known",
                violation_error_message="Unknown key type.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


class AuditEvent(models.Model):
    """Who did what to a tenant's account: members, invitations, tokens, status."""

    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        related_name="audit_events",
        verbose_name="tenant",
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="by",
    )
    action = models.CharField("action", max_length=64)
    summary = models.CharField("summary", max_length=300)
    data = models.JSONField("data", default=dict, blank=True)
    at = models.DateTimeField("at", auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "audit event"
        indexes = [models.Index(fields=["tenant", "-at"], name="tenants_audit_tenant_at_idx")]

    def __str__(self) -> str:
        return f"{self.action}: {self.summary}"
