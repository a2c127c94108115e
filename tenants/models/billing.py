"""Money: tiers and their prices, purchases of hours, the credit ledger, minutes
metered, the credit rate and tenants' requests for credit."""

from decimal import ROUND_DOWN, Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from ..money import round_half_up
from .accounts import TenantScopedQuerySet


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
    interruptible_discount_pct = models.PositiveSmallIntegerField(
        "interruptible discount (%)",
        default=50,
        help_text="Off the price for interruptible hours: their slices may be preempted.",
    )

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
            models.CheckConstraint(
                condition=Q(interruptible_discount_pct__lte=90),
                name="%(app_label)s_%(class)s_discount_at_most_90",
                violation_error_message="An interruptible discount is at most 90%.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def price_of(self, hours: int, *, interruptible: bool = False) -> Decimal:
        """What `hours` of this tier cost, in credits; interruptible ones at the discount."""
        price = self.price_per_hour * hours
        if interruptible:
            price = price * (100 - self.interruptible_discount_pct) / 100
        return round_half_up(price)

    @property
    def interruptible_price_per_hour(self) -> Decimal:
        return self.price_of(1, interruptible=True)

    @property
    def vram_gb(self) -> int:
        return self.vram_mb // 1024

    @property
    def host_ram_gb(self) -> int:
        return self.host_ram_mb // 1024


class Purchase(models.Model):
    # Metering warns the tenant once when this few minutes are left (pages list it too).
    LOW_TIME_WARNING_MINUTES = 10

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
    interruptible = models.BooleanField(
        "interruptible",
        default=False,
        help_text="Bought at the tier's interruptible discount: its slices run only on "
        "overcommitted GPUs and are preempted when the card runs short of memory.",
    )
    price_paid = models.DecimalField("price paid", max_digits=12, decimal_places=2)
    minutes_total = models.PositiveIntegerField("minutes bought")
    minutes_left = models.PositiveIntegerField("minutes left")
    idempotency_key = models.CharField("idempotency key", max_length=128, blank=True)
    idempotency_fingerprint = models.CharField(
        "request fingerprint",
        max_length=64,
        blank=True,
        help_text="SHA-256 of what the keyed request asked for: a replay must match it.",
    )
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
    api_token = models.ForeignKey(
        "tenants.ApiToken",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="bought with token",
        help_text="The API token that made it, for that token's spend limit.",
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
        STORAGE = "storage", "volume storage"

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
    idempotency_fingerprint = models.CharField(
        "request fingerprint",
        max_length=64,
        blank=True,
        help_text="SHA-256 of what the keyed request asked for: a replay must match it.",
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
                | (Q(kind__in=["purchase", "storage"]) & Q(amount__lt=0))
                | Q(kind="adjustment"),
                name="%(app_label)s_%(class)s_sign_matches_kind",
                violation_error_message="Grants and refunds add credit; purchases and "
                "storage take it.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} ({self.tenant})"


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


class StoragePrice(models.Model):
    """What a GB of volume costs per hour, in credits, whatever the tier, as ops set it.
    Append-only like CreditRate: the newest row is in force (none: the default setting)."""

    credits_per_gb_hour = models.DecimalField(
        "credits per GB-hour", max_digits=12, decimal_places=6
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
        verbose_name = "storage price"
        constraints = [
            models.CheckConstraint(
                condition=Q(credits_per_gb_hour__gte=0),
                name="%(app_label)s_%(class)s_price_not_negative",
                violation_error_message="Storage cannot pay the tenant.",
            ),
            models.CheckConstraint(
                condition=~Q(reason=""),
                name="%(app_label)s_%(class)s_reason_required",
                violation_error_message="Say why the price changes.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.credits_per_gb_hour} credits per GB-hour"


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
