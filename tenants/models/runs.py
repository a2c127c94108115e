"""A slice's runs: each start (the launch, then every resume) is a row of its own, with
where it ran, its container, its times, how it ended, and its minutes and cost on the
purchase that paid for it. Facts are copied, not linked: the allocation a run held is
released (and may be reused or removed) long after the run is history."""

from decimal import Decimal

from django.db import models
from django.db.models import Q

from ..money import round_half_up
from .accounts import TenantScopedQuerySet


class SliceRun(models.Model):
    """One run of a slice: opened when the slice is launched or resumed, placed and
    started by provisioning, metered while it runs, and closed when it ends."""

    class End(models.TextChoices):
        STOPPED = "stopped", "stopped"
        COMPLETED = "completed", "completed"
        FAILED = "failed", "failed"
        REFUSED = "refused", "refused"

    slice = models.ForeignKey(
        "tenants.Slice", on_delete=models.CASCADE, related_name="run_rows", verbose_name="slice"
    )
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="+", verbose_name="tenant"
    )
    number = models.PositiveIntegerField("run", help_text="1 for the launch, then one per resume.")
    purchase = models.ForeignKey(
        "tenants.Purchase",
        on_delete=models.PROTECT,
        related_name="slice_runs",
        verbose_name="paid from",
    )
    interruptible = models.BooleanField("interruptible", default=False)
    guaranteed = models.BooleanField("guaranteed", default=True)
    vram_mb = models.PositiveIntegerField("VRAM quota (MiB)", default=0)
    node_name = models.CharField("node", max_length=64, blank=True)
    gpu_uuid = models.CharField("GPU UUID", max_length=96, blank=True)
    gpu_label = models.CharField("GPU", max_length=120, blank=True)
    gpu_model = models.CharField("GPU model", max_length=128, blank=True)
    mig_device_uuid = models.CharField("MIG device UUID", max_length=96, blank=True)
    container_id = models.CharField("container ID", max_length=128, blank=True)
    connection = models.JSONField(
        "connection summary",
        default=dict,
        blank=True,
        help_text="How it was reached (kind, host, ports, user): never a token or a key.",
    )
    requested_at = models.DateTimeField("requested")
    started_at = models.DateTimeField("started", null=True, blank=True)
    ended_at = models.DateTimeField("ended", null=True, blank=True)
    end_state = models.CharField("end", max_length=16, choices=End.choices, blank=True)
    end_reason = models.CharField("why it ended", max_length=500, blank=True)
    exit_code = models.IntegerField("exit code", null=True, blank=True)
    ended_by = models.CharField("ended by", max_length=16, blank=True)
    minutes = models.PositiveIntegerField("minutes metered", default=0)
    cost = models.DecimalField(
        "cost (credits)",
        max_digits=12,
        decimal_places=2,
        default=Decimal("0.00"),
        help_text="Its minutes at its purchase's price per minute, rounded half up.",
    )
    peak_vram_mb = models.PositiveIntegerField("measured peak VRAM (MiB)", null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["slice", "number"]
        verbose_name = "slice run"
        constraints = [
            models.UniqueConstraint(
                fields=["slice", "number"],
                name="%(app_label)s_%(class)s_one_per_number",
                violation_error_message="A slice has one run per number.",
            ),
            models.UniqueConstraint(
                fields=["slice"],
                condition=Q(ended_at__isnull=True),
                name="%(app_label)s_%(class)s_one_open_per_slice",
                violation_error_message="A slice has at most one run that has not ended.",
            ),
            models.CheckConstraint(
                condition=Q(number__gte=1),
                name="%(app_label)s_%(class)s_number_positive",
                violation_error_message="Runs are numbered from 1.",
            ),
        ]

    def __str__(self) -> str:
        return f"slice {self.slice_id} run {self.number}"

    @property
    def is_open(self) -> bool:
        return self.ended_at is None


def run_cost(*, minutes: int, price_paid: Decimal, minutes_total: int) -> Decimal:
    """What `minutes` of a purchase are worth: its price per minute (what was paid over
    what was bought), rounded half up to the cent like every amount shown."""
    if not minutes_total:
        return Decimal("0.00")
    return round_half_up(price_paid / Decimal(minutes_total) * minutes)
