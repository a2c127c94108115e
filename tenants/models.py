"""Tenants, their people and money, and the slices they launch.

Every tenant-owned model's manager has `for_tenant(tenant)`: views, API and selectors
read through it, so another tenant's object is simply not found (404).
"""

from decimal import ROUND_DOWN, Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q


class TenantScopedQuerySet(models.QuerySet):
    tenant_field = "tenant"

    def for_tenant(self, tenant: "Tenant | None") -> "TenantScopedQuerySet":
        if tenant is None:
            return self.none()
        return self.filter(**{self.tenant_field: tenant})


class TenantQuerySet(models.QuerySet):
    def visible_to(self, user) -> "TenantQuerySet":  # type: ignore[no-untyped-def]
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
    def live(self) -> "ApiTokenQuerySet":
        from django.utils import timezone

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
    last_used_at = models.DateTimeField("last used", null=True, blank=True)
    revoked_at = models.DateTimeField("revoked", null=True, blank=True)

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
        from django.utils import timezone

        return self.revoked_at is None and (
            self.expires_at is None or self.expires_at > timezone.now()
        )


class Tier(models.Model):
    """A VRAM tier the platform sells. Seeded with 4, 8, 12 and 24 GB; ops edit in admin."""

    name = models.CharField("name", max_length=32, unique=True)
    vram_mb = models.PositiveIntegerField("VRAM (MiB)", unique=True)
    cpu_cores = models.DecimalField("CPU cores", max_digits=5, decimal_places=2)
    host_ram_mb = models.PositiveIntegerField("host RAM (MiB)")
    pids_limit = models.PositiveIntegerField("process limit", default=4096)
    price_per_hour = models.DecimalField("price per hour (credits)", max_digits=8, decimal_places=2)
    is_active = models.BooleanField("on sale", default=True)
    description = models.CharField("description", max_length=200, blank=True)

    class Meta:
        ordering = ["vram_mb"]
        verbose_name = "tier"
        constraints = [
            models.CheckConstraint(
                condition=Q(vram_mb__gt=0),
                name="%(app_label)s_%(class)s_vram_positive",
                violation_error_message="A tier must include some VRAM.",
            ),
            models.CheckConstraint(
                condition=Q(cpu_cores__gt=0) & Q(host_ram_mb__gt=0) & Q(pids_limit__gt=0),
                name="%(app_label)s_%(class)s_resources_positive",
                violation_error_message="CPU cores, host RAM and process limit must be positive.",
            ),
            models.CheckConstraint(
                condition=Q(price_per_hour__gte=0),
                name="%(app_label)s_%(class)s_price_non_negative",
                violation_error_message="A price cannot be negative.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def vram_gb(self) -> int:
        return self.vram_mb // 1024

    @property
    def host_ram_gb(self) -> int:
        return self.host_ram_mb // 1024


class Purchase(models.Model):
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.PROTECT,
        related_name="purchases",
        verbose_name="tenant",
    )
    tier = models.ForeignKey(
        "tenants.Tier", on_delete=models.PROTECT, related_name="purchases", verbose_name="tier"
    )
    hours = models.PositiveIntegerField("hours")
    price_paid = models.DecimalField("price paid", max_digits=12, decimal_places=2)
    minutes_total = models.PositiveIntegerField("minutes bought")
    minutes_left = models.PositiveIntegerField("minutes left")
    idempotency_key = models.CharField("idempotency key", max_length=128, blank=True)
    low_warning_at = models.DateTimeField("low-time warning sent", null=True, blank=True)
    refunded_at = models.DateTimeField("refunded", null=True, blank=True)
    refunded_amount = models.DecimalField(
        "refunded", max_digits=12, decimal_places=2, default=Decimal("0.00")
    )
    minutes_refunded = models.PositiveIntegerField("minutes refunded", default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="purchases",
        verbose_name="bought by",
    )
    created_at = models.DateTimeField("bought", auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "purchase"
        constraints = [
            models.CheckConstraint(
                condition=Q(hours__gt=0),
                name="%(app_label)s_%(class)s_hours_positive",
                violation_error_message="A purchase must be for at least one hour.",
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="%(app_label)s_%(class)s_unique_idempotency_key",
                violation_error_message="A purchase with this idempotency key already exists.",
            ),
            models.CheckConstraint(
                condition=Q(refunded_amount__gte=0) & Q(refunded_amount__lte=F("price_paid")),
                name="%(app_label)s_%(class)s_refund_within_price",
                violation_error_message="A refund cannot exceed what was paid.",
            ),
            models.CheckConstraint(
                condition=Q(minutes_left__lte=F("minutes_total")),
                name="%(app_label)s_%(class)s_minutes_left_within_total",
                violation_error_message="Minutes left cannot exceed the minutes bought.",
            ),
            models.CheckConstraint(
                condition=Q(price_paid__gte=0),
                name="%(app_label)s_%(class)s_price_non_negative",
                violation_error_message="A price cannot be negative.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tier} x {self.hours} h for {self.tenant}"

    @property
    def refund_due(self) -> Decimal:
        """What a refund returns now: the unused minutes' share of the price, rounded down to
        the cent (never more than was paid and not yet refunded)."""
        if not self.minutes_total:
            return Decimal("0.00")
        share = self.price_paid * Decimal(self.minutes_left) / Decimal(self.minutes_total)
        amount = share.quantize(Decimal("0.01"), rounding=ROUND_DOWN)
        return min(amount, self.price_paid - self.refunded_amount)

    @property
    def minutes_used(self) -> int:
        """Minutes a slice ran on it: neither left nor refunded."""
        return self.minutes_total - self.minutes_left - self.minutes_refunded


class LedgerEntry(models.Model):
    """Append-only credit movement. The tenant's balance is the sum of its entries."""

    class Kind(models.TextChoices):
        GRANT = "grant", "credit granted"
        PURCHASE = "purchase", "purchase"
        REFUND = "refund", "refund"
        ADJUSTMENT = "adjustment", "adjustment"

    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        verbose_name="tenant",
    )
    kind = models.CharField("kind", max_length=16, choices=Kind.choices)
    amount = models.DecimalField("amount", max_digits=12, decimal_places=2)
    balance_after = models.DecimalField("balance after", max_digits=12, decimal_places=2)
    purchase = models.ForeignKey(
        "tenants.Purchase",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="ledger_entries",
        verbose_name="purchase",
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="ledger_entries",
        verbose_name="by",
    )
    memo = models.CharField("memo", max_length=200, blank=True)
    idempotency_key = models.CharField(
        "idempotency key",
        max_length=128,
        blank=True,
        help_text="A grant retried with the same key is written once.",
    )
    created_at = models.DateTimeField("at", auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "ledger entry"
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="%(app_label)s_%(class)s_unique_idempotency_key",
                violation_error_message="A ledger entry with this idempotency key exists.",
            ),
            models.CheckConstraint(
                condition=~Q(amount=0),
                name="%(app_label)s_%(class)s_amount_non_zero",
                violation_error_message="A ledger entry must move some credit.",
            ),
            models.CheckConstraint(
                condition=Q(balance_after__gte=0),
                name="%(app_label)s_%(class)s_balance_after_non_negative",
                violation_error_message="The credit balance cannot go below zero.",
            ),
            models.CheckConstraint(
                condition=(Q(kind__in=["grant", "refund"]) & Q(amount__gt=0))
                | (Q(kind="purchase") & Q(amount__lt=0))
                | Q(kind="adjustment"),
                name="%(app_label)s_%(class)s_sign_matches_kind",
                violation_error_message="Grants and refunds add credit; purchases take it.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} ({self.tenant})"


class Image(models.Model):
    """A container image ops allow tenants to launch."""

    class Connect(models.TextChoices):
        SSH = "ssh", "SSH with the tenant's public key"
        JUPYTER = "jupyter", "Jupyter with a token"
        SERVICE = "service", "the image's own service"

    name = models.CharField("name", max_length=64, unique=True)
    reference = models.CharField(
        "reference", max_length=255, help_text="Repository and tag, e.g. pytorch/pytorch:2.4.0"
    )
    digest = models.CharField(
        "digest",
        max_length=71,
        blank=True,
        help_text="sha256:… to pin the exact image; the launch then runs reference@digest.",
    )
    description = models.CharField("description", max_length=300, blank=True)
    default_command = models.JSONField("default command (argv)", default=list, blank=True)
    ports = models.JSONField("exposed ports", default=list, blank=True)
    connect = models.CharField(
        "how the tenant connects", max_length=16, choices=Connect.choices, default=Connect.SSH
    )
    is_active = models.BooleanField("allowed", default=True)
    # Its configuration as a node had it when ops added or changed it (a start checks
    # again on the node it runs on).
    inspected_at = models.DateTimeField("inspected", null=True, blank=True)
    inspected_on = models.CharField("inspected on node", max_length=64, blank=True)
    inspected_image_id = models.CharField("image id", max_length=80, blank=True)
    inspection_note = models.CharField("inspection", max_length=300, blank=True)
    created_at = models.DateTimeField("added", auto_now_add=True)
    updated_at = models.DateTimeField("changed", auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "image"
        constraints = [
            models.CheckConstraint(
                condition=Q(connect__in=["ssh", "jupyter", "service"]),
                name="%(app_label)s_%(class)s_connect_known",
                violation_error_message="Unknown connection kind.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def pinned_reference(self) -> str:
        return f"{self.reference}@{self.digest}" if self.digest else self.reference


# Spelled here because Slice.Meta's constraints cannot see Slice's class attributes;
# everything else reads them as Slice.LIVE_STATES and Slice.MUST_HOLD_ALLOCATION_STATES.
_LIVE_STATES = ("requested", "queued", "provisioning", "running", "stopping")
_MUST_HOLD_ALLOCATION_STATES = ("running", "stopping")


class Slice(models.Model):
    """A tenant's tier-sized container: the launch lifecycle lives here."""

    class State(models.TextChoices):
        REQUESTED = "requested", "requested"
        REFUSED = "refused", "refused"
        QUEUED = "queued", "queued"
        PROVISIONING = "provisioning", "provisioning"
        RUNNING = "running", "running"
        STOPPING = "stopping", "stopping"
        STOPPED = "stopped", "stopped"
        FAILED = "failed", "failed"

    FINAL_STATES = (State.REFUSED, State.STOPPED, State.FAILED)
    # Not final: the slice uses its purchase (one at a time, no refund meanwhile).
    LIVE_STATES = _LIVE_STATES
    # Live and past the queue: VRAM is reserved on a node, so its container is no orphan.
    HOLDS_VRAM_STATES = (State.PROVISIONING, State.RUNNING, State.STOPPING)
    # Started: the database refuses these without an allocation (provisioning may lack one).
    MUST_HOLD_ALLOCATION_STATES = _MUST_HOLD_ALLOCATION_STATES

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="slices", verbose_name="tenant"
    )
    purchase = models.ForeignKey(
        "tenants.Purchase",
        on_delete=models.PROTECT,
        related_name="slices",
        verbose_name="purchase",
    )
    image = models.CharField("image reference", max_length=255)
    image_entry = models.ForeignKey(
        "tenants.Image",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="slices",
        verbose_name="image",
    )
    vram_mb = models.PositiveIntegerField("VRAM quota (MiB)", default=0)
    guaranteed = models.BooleanField(
        "guaranteed",
        default=True,
        help_text="Never on an overcommitted GPU (online inference, hardware isolation).",
    )
    ssh_public_key = models.TextField("SSH public key", blank=True)
    model_request = models.JSONField("estimate input", default=dict, blank=True)
    command = models.JSONField("command (argv)", default=list, blank=True)
    environment = models.JSONField("environment", default=dict, blank=True)
    estimate_mb = models.PositiveIntegerField("estimated VRAM (MiB)", null=True, blank=True)
    estimate = models.JSONField("estimate breakdown", default=dict, blank=True)
    state = models.CharField("state", max_length=16, choices=State.choices, default=State.REQUESTED)
    state_reason = models.CharField("state reason", max_length=500, blank=True)
    allocation = models.OneToOneField(
        "nodes.Allocation",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="slice",
        verbose_name="VRAM allocation",
    )
    container_id = models.CharField("container ID", max_length=128, blank=True)
    connection = models.JSONField("connection details", default=dict, blank=True)
    idempotency_key = models.CharField("idempotency key", max_length=128, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="slices",
        verbose_name="launched by",
    )
    created_at = models.DateTimeField("requested", auto_now_add=True)
    queued_at = models.DateTimeField("queued", null=True, blank=True)
    provision_attempts = models.PositiveSmallIntegerField("provisioning attempts", default=0)
    provision_started_at = models.DateTimeField("provisioning since", null=True, blank=True)
    started_at = models.DateTimeField("started", null=True, blank=True)
    stopped_at = models.DateTimeField("stopped", null=True, blank=True)
    last_metered_at = models.DateTimeField("metered up to", null=True, blank=True)
    minutes_used = models.PositiveIntegerField("minutes metered", default=0)
    exit_code = models.IntegerField("exit code", null=True, blank=True)
    peak_vram_mb = models.PositiveIntegerField("measured peak VRAM (MiB)", null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "slice"
        indexes = [
            models.Index(fields=["tenant", "state"], name="tenants_slice_tenant_state_idx"),
            models.Index(fields=["state", "queued_at"], name="tenants_slice_state_queue_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["purchase"],
                condition=Q(state__in=_LIVE_STATES),
                name="%(app_label)s_%(class)s_one_live_per_purchase",
                violation_error_message="This purchase already has a slice that is not stopped.",
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="%(app_label)s_%(class)s_unique_idempotency_key",
                violation_error_message="A launch with this idempotency key already exists.",
            ),
            models.CheckConstraint(
                condition=Q(state__in=_MUST_HOLD_ALLOCATION_STATES, allocation__isnull=False)
                | ~Q(state__in=_MUST_HOLD_ALLOCATION_STATES),
                name="%(app_label)s_%(class)s_running_has_allocation",
                violation_error_message="A running slice must hold a VRAM allocation.",
            ),
        ]

    def __str__(self) -> str:
        return f"slice {self.pk} ({self.state})"

    @property
    def owner_key(self) -> str:
        """The opaque key `nodes` labels this slice's allocation and container with."""
        return f"slice-{self.pk}"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def container_name(self) -> str:
        return f"gpp-slice-{self.pk}"

    @property
    def cost_so_far(self) -> Decimal:
        """Credits the minutes metered so far are worth at the purchase's price per minute
        (what was paid over what was bought), rounded down to the cent like a refund, so a
        purchase's slices never add up to more than was paid."""
        purchase = self.purchase
        if purchase is None or not purchase.minutes_total:
            return Decimal("0.00")
        per_minute = purchase.price_paid / Decimal(purchase.minutes_total)
        return (per_minute * self.minutes_used).quantize(Decimal("0.01"), rounding=ROUND_DOWN)


class UsageRecord(models.Model):
    """Minutes of a purchase a running slice consumed: one row per metering step."""

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="usage", verbose_name="tenant"
    )
    slice = models.ForeignKey(
        "tenants.Slice", on_delete=models.CASCADE, related_name="usage", verbose_name="slice"
    )
    purchase = models.ForeignKey(
        "tenants.Purchase", on_delete=models.CASCADE, related_name="usage", verbose_name="purchase"
    )
    minutes = models.PositiveIntegerField("minutes")
    minutes_left_after = models.PositiveIntegerField("minutes left after")
    period_start = models.DateTimeField("from")
    period_end = models.DateTimeField("to")
    at = models.DateTimeField("recorded", auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-period_end", "-id"]
        verbose_name = "usage record"
        constraints = [
            models.CheckConstraint(
                condition=Q(minutes__gt=0) & Q(period_end__gt=F("period_start")),
                name="%(app_label)s_%(class)s_positive_period",
                violation_error_message="A usage record covers at least one minute.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.minutes} min of {self.purchase_id} by slice {self.slice_id}"


class SliceTransition(models.Model):
    slice = models.ForeignKey(
        "tenants.Slice",
        on_delete=models.CASCADE,
        related_name="transitions",
        verbose_name="slice",
    )
    from_state = models.CharField("from", max_length=16, blank=True)
    to_state = models.CharField("to", max_length=16)
    reason = models.CharField("reason", max_length=500, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="by",
    )
    at = models.DateTimeField("at", auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        verbose_name = "slice transition"

    def __str__(self) -> str:
        return f"{self.from_state or '-'} -> {self.to_state}"


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


class CreditRate(models.Model):
    """What one credit is worth in money, as ops set it. Append-only: the newest row is the
    rate in force, and the rows before it are the audit trail (who, when, why)."""

    currency = models.CharField("currency", max_length=3, help_text="ISO 4217 code, e.g. USD.")
    per_credit = models.DecimalField(
        "value of one credit", max_digits=12, decimal_places=4, help_text="In the currency."
    )
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="set by",
    )
    reason = models.CharField("reason", max_length=300)
    created_at = models.DateTimeField("at", auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "credit rate"
        constraints = [
            models.CheckConstraint(
                condition=Q(per_credit__gt=0),
                name="%(app_label)s_%(class)s_per_credit_positive",
                violation_error_message="A credit must be worth something.",
            ),
            models.CheckConstraint(
                condition=Q(currency__regex=r"^[A-Z]{3}$"),
                name="%(app_label)s_%(class)s_currency_iso",
                violation_error_message="The currency is a three-letter ISO 4217 code.",
            ),
            models.CheckConstraint(
                condition=~Q(reason=""),
                name="%(app_label)s_%(class)s_reason_required",
                violation_error_message="Say why the rate changes.",
            ),
        ]

    def __str__(self) -> str:
        return f"1 credit = {self.per_credit} {self.currency}"


class CreditRequest(models.Model):
    """A tenant asking ops for credit; ops grant it (a ledger entry) or decline it."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        GRANTED = "granted", "granted"
        DECLINED = "declined", "declined"
        WITHDRAWN = "withdrawn", "withdrawn"

    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        related_name="credit_requests",
        verbose_name="tenant",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="requested by",
    )
    amount = models.DecimalField("credits asked", max_digits=12, decimal_places=2)
    note = models.CharField("note", max_length=500, blank=True)
    status = models.CharField(
        "status", max_length=16, choices=Status.choices, default=Status.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="decided by",
    )
    decided_at = models.DateTimeField("decided at", null=True, blank=True)
    decision_note = models.CharField("decision note", max_length=500, blank=True)
    ledger_entry = models.OneToOneField(
        "tenants.LedgerEntry",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="credit_request",
        verbose_name="grant",
    )
    created_at = models.DateTimeField("asked at", auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "credit request"
        constraints = [
            models.CheckConstraint(
                condition=Q(amount__gt=0),
                name="%(app_label)s_%(class)s_amount_positive",
                violation_error_message="Ask for a positive amount of credit.",
            ),
            models.UniqueConstraint(
                fields=["tenant"],
                condition=Q(status="pending"),
                name="%(app_label)s_%(class)s_one_pending_per_tenant",
                violation_error_message="This tenant already has a request waiting for ops.",
            ),
            models.CheckConstraint(
                condition=Q(status="granted", ledger_entry__isnull=False)
                | (~Q(status="granted") & Q(ledger_entry__isnull=True)),
                name="%(app_label)s_%(class)s_granted_has_entry",
                violation_error_message="A granted request points at its ledger entry.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.amount} credits ({self.status})"
