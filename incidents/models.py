"""The incident ledger: one open incident per rule and target, with a runbook timeline."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.postgres.expressions import ArraySubquery
from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, F, IntegerField, Lookup, Q, Value, When
from django.db.models.sql.compiler import SQLCompiler

from .rules import OPS_ONLY
from .rules import Thresholds as RuleThresholds

if TYPE_CHECKING:  # incidents depend on tenants; only the type is needed here
    from nodes.models import Node
    from tenants.models import Tenant

# The severity sort: critical first, then warning, then the rest. One expression for the
# ledger's ORDER BY and the index that serves it (PostgreSQL matches them as written).
SEVERITY_RANK = Case(
    When(severity="critical", then=Value(0)),
    When(severity="warning", then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)


class AnyOf(Lookup):
    """`column = ANY(array)`: unlike `IN (subquery)` beside an OR, PostgreSQL can read it
    from an index and estimate it, so a tenant's incidents are found through its own
    index entries, not by filtering the whole ledger."""

    lookup_name = "any_of"
    prepare_rhs = False

    def as_sql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper
    ) -> tuple[str, tuple[Any, ...]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        # a tuple, as Django's own operator lookups give theirs
        return f"{lhs} = ANY({rhs})", (*lhs_params, *rhs_params)


class IncidentQuerySet(models.QuerySet["Incident"]):
    def for_tenant(self, tenant: Tenant | None) -> IncidentQuerySet:
        """A tenant's: those about its slices, and those that touched its slices (a node
        that stopped answering, a GPU drained for a fault under them); never ops' own."""
        if tenant is None:
            return self.none()
        touched = IncidentSlice.objects.filter(tenant=tenant).values("incident_id")
        if connections[self.db].vendor == "postgresql":
            also = Q(AnyOf(F("pk"), ArraySubquery(touched)))
        else:  # SQLite (the embedded `make run` default) has no arrays: the plain IN
            also = Q(pk__in=touched)
        return self.filter(Q(tenant=tenant) | also).exclude(rule__in=OPS_ONLY)

    def open(self) -> IncidentQuerySet:
        return self.exclude(status=Incident.Status.RESOLVED)


class Incident(models.Model):
    class RootCause(models.TextChoices):
        NO_ISOLATION = "no_isolation", "no hardware/quota isolation"
        RECLAIM_FAILURE = "reclaim_failure", "scheduling / reclaim failure"
        APP_PARAMETERS = "app_parameters", "application parameters"
        HARDWARE = "hardware", "hardware fault"
        CONNECTIVITY = "connectivity", "connectivity"
        UNCLASSIFIED = "unclassified", "not yet classified"

    class Severity(models.TextChoices):
        INFO = "info", "info"
        WARNING = "warning", "warning"
        CRITICAL = "critical", "critical"

    class Status(models.TextChoices):
        OPEN = "open", "open"
        ACKNOWLEDGED = "acknowledged", "acknowledged"
        MITIGATED = "mitigated", "mitigated"
        RESOLVED = "resolved", "resolved"

    rule = models.CharField("rule", max_length=64)
    target_key = models.CharField(
        "target", max_length=200, help_text="What the rule fired on, e.g. gpu:<uuid>."
    )
    title = models.CharField("title", max_length=200)
    root_cause = models.CharField(
        "root-cause class",
        max_length=32,
        choices=RootCause.choices,
        default=RootCause.UNCLASSIFIED,
    )
    severity = models.CharField(
        "severity", max_length=16, choices=Severity.choices, default=Severity.WARNING
    )
    status = models.CharField("status", max_length=16, choices=Status.choices, default=Status.OPEN)
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="incidents",
        verbose_name="tenant",
    )
    node = models.ForeignKey(
        "nodes.Node",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="incidents",
        verbose_name="node",
    )
    gpu = models.ForeignKey(
        "nodes.Gpu",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="incidents",
        verbose_name="GPU",
    )
    slice = models.ForeignKey(
        "tenants.Slice",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="incidents",
        verbose_name="slice",
    )
    evidence = models.JSONField("evidence (frozen at detection)", default=dict, blank=True)
    condition_since = models.DateTimeField(
        "condition began",
        null=True,
        blank=True,
        help_text="When the condition began as far as the samples show (evidence "
        '"condition_since"): the KPIs\' time to detect reads it here, not from the evidence.',
    )
    first_seen_at = models.DateTimeField("first seen")
    last_seen_at = models.DateTimeField("last seen")
    occurrences = models.PositiveIntegerField("occurrences", default=1)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="acknowledged by",
    )
    acknowledged_at = models.DateTimeField("acknowledged", null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="resolved by",
    )
    resolved_at = models.DateTimeField("resolved", null=True, blank=True)
    resolution_note = models.TextField("resolution note", blank=True)

    objects = IncidentQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen_at"]
        verbose_name = "incident"
        # One per order of the ledger (newest activity, first seen, severity,
        # occurrences; ties broken by id, newest first), so that a page is read from an
        # index from where the last one ended (incidents.paging) instead of sorting the
        # ledger; the status filter and the unresolved view have their own.
        indexes = [
            models.Index(fields=["-last_seen_at", "-id"], name="incidents_seen_idx"),
            models.Index(
                fields=["status", "-last_seen_at", "-id"], name="incidents_status_seen_id_idx"
            ),
            models.Index(
                fields=["-last_seen_at", "-id"],
                condition=~Q(status="resolved"),
                name="incidents_unresolved_seen_idx",
            ),
            # first_seen_at ranges are the KPIs' too: the columns they read are included,
            # so a period is counted from the index alone
            models.Index(
                fields=["-first_seen_at", "-id"],
                include=["root_cause", "node", "gpu", "resolved_at", "condition_since"],
                name="incidents_first_seen_idx",
            ),
            models.Index(SEVERITY_RANK, F("id").desc(), name="incidents_severity_rank_idx"),
            models.Index(fields=["-occurrences", "-id"], name="incidents_occurrences_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "target_key"],
                condition=~Q(status="resolved"),
                name="%(app_label)s_%(class)s_one_open_per_rule_target",
                violation_error_message="An unresolved incident already exists for this rule "
                "and target.",
            ),
            models.CheckConstraint(
                condition=Q(last_seen_at__gte=F("first_seen_at")),
                name="%(app_label)s_%(class)s_seen_in_order",
                violation_error_message="Last seen cannot be before first seen.",
            ),
            models.CheckConstraint(
                condition=Q(occurrences__gte=1),
                name="%(app_label)s_%(class)s_occurrences_positive",
                violation_error_message="An incident has at least one occurrence.",
            ),
            models.CheckConstraint(
                condition=Q(status="resolved", resolved_at__isnull=False)
                | (~Q(status="resolved") & Q(resolved_at__isnull=True)),
                name="%(app_label)s_%(class)s_resolved_at_iff_resolved",
                violation_error_message="Only a resolved incident has a resolution time.",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    @property
    def affected_node(self) -> Node | None:
        """The node an incident is about: its own, else its GPU's."""
        if self.node is not None:
            return self.node
        return self.gpu.node if self.gpu is not None else None


class IncidentSlice(models.Model):
    """A slice an incident touched besides its own: the running slices on a node that
    stopped answering, or on a GPU drained for a hardware fault. Their tenants see the
    incident, in plain words."""

    incident = models.ForeignKey(
        "incidents.Incident",
        on_delete=models.CASCADE,
        related_name="touched",
        verbose_name="incident",
    )
    slice = models.ForeignKey(
        "tenants.Slice",
        on_delete=models.CASCADE,
        related_name="incidents_touched",
        verbose_name="slice",
    )
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        related_name="incidents_touched",
        verbose_name="tenant",
    )

    class Meta:
        verbose_name = "slice an incident touched"
        constraints = [
            models.UniqueConstraint(
                fields=["incident", "slice"],
                name="%(app_label)s_%(class)s_once",
                violation_error_message="This slice is already recorded for this incident.",
            ),
        ]

    def __str__(self) -> str:
        return f"incident {self.incident_id} touched slice {self.slice_id}"


class IncidentEvent(models.Model):
    """One line of an incident's timeline: the runbook's five steps and every action."""

    class Kind(models.TextChoices):
        DETECTED = "detected", "detected"
        LOCATED = "located", "located"
        CLASSIFIED = "classified", "classified"
        DISPOSED = "disposed", "disposed"
        ARCHIVED = "archived", "archived"
        ACTION = "action", "action taken"
        STATUS = "status", "status changed"
        NOTE = "note", "note"

    incident = models.ForeignKey(
        "incidents.Incident",
        on_delete=models.CASCADE,
        related_name="events",
        verbose_name="incident",
    )
    kind = models.CharField("kind", max_length=16, choices=Kind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="by",
        help_text="Empty when the system acted.",
    )
    message = models.CharField("message", max_length=500)
    data = models.JSONField("data", default=dict, blank=True)
    at = models.DateTimeField("at", auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        verbose_name = "incident event"

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class Thresholds(models.Model):
    """The watchdog's thresholds: one row, docs/domain.md's numbers by default, edited by ops."""

    vram_warning_pct = models.FloatField("VRAM warning (%)", default=85.0)
    vram_critical_pct = models.FloatField("VRAM critical: placements stop (%)", default=95.0)
    breaker_reset_pct = models.FloatField("placements resume below (%)", default=85.0)
    process_jump_mb = models.PositiveIntegerField("process jump (MiB)", default=3072)
    sweep_high_pct = models.FloatField("fleet sweep: card above (%)", default=90.0)
    sweep_rise_mb = models.PositiveIntegerField("fleet sweep: rise (MiB)", default=5120)
    sweep_window_s = models.PositiveIntegerField("fleet sweep: window (s)", default=300)
    leak_window_s = models.PositiveIntegerField("leak window (s)", default=1800)
    leak_min_growth_mb = models.PositiveIntegerField("leak: minimum growth (MiB)", default=1024)
    idle_after_s = models.PositiveIntegerField("idle after (s)", default=900)
    idle_stop_after_s = models.PositiveIntegerField("idle: stop after warning (s)", default=300)
    bandwidth_pct = models.FloatField("memory-bandwidth limit per process (%)", default=70.0)
    quota_grace_samples = models.PositiveSmallIntegerField(
        "quota breach grace (samples)", default=1
    )
    orphan_confirm_samples = models.PositiveSmallIntegerField(
        "orphan confirmed after (samples)", default=2
    )
    unattributed_mb = models.PositiveIntegerField("unattributed memory (MiB)", default=1024)
    drift_min_mb = models.PositiveIntegerField(
        "accounting drift: at least (MiB)",
        default=512,
        help_text="NVML and the quota library may disagree by this much ...",
    )
    drift_pct = models.FloatField(
        "accounting drift: at least (%)",
        default=10.0,
        help_text="... or this share of the larger count, whichever is more ...",
    )
    drift_samples = models.PositiveSmallIntegerField(
        "accounting drift: samples in a row", default=2, help_text="... before an incident."
    )
    updated_at = models.DateTimeField("changed", auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="changed by",
    )

    class Meta:
        verbose_name = "watchdog thresholds"
        verbose_name_plural = "watchdog thresholds"
        constraints = [
            models.CheckConstraint(
                condition=Q(vram_warning_pct__gt=0)
                & Q(vram_warning_pct__lte=F("vram_critical_pct"))
                & Q(vram_critical_pct__lte=100)
                & Q(breaker_reset_pct__lte=F("vram_critical_pct"))
                & Q(breaker_reset_pct__gt=0),
                name="%(app_label)s_%(class)s_vram_levels_ordered",
                violation_error_message="Need 0 < warning <= critical <= 100, reset <= critical.",
            ),
            models.CheckConstraint(
                # a zero would make every slice idle, every sample a breach, every
                # process confirmed: the fleet stopped by one typo
                condition=Q(process_jump_mb__gte=256)
                & Q(sweep_rise_mb__gte=256)
                & Q(sweep_window_s__gte=60)
                & Q(leak_window_s__gte=300)
                & Q(leak_min_growth_mb__gte=64)
                & Q(idle_after_s__gte=300)
                & Q(idle_stop_after_s__gte=60)
                & Q(quota_grace_samples__gte=1)
                & Q(orphan_confirm_samples__gte=2)
                & Q(unattributed_mb__gte=64)
                & Q(drift_min_mb__gte=64)
                & Q(drift_pct__gt=0)
                & Q(drift_pct__lte=100)
                & Q(drift_samples__gte=1),
                name="%(app_label)s_%(class)s_limits_sane",
                violation_error_message="A limit is below its safe minimum.",
            ),
            models.CheckConstraint(
                condition=Q(bandwidth_pct__gt=0) & Q(bandwidth_pct__lte=100),
                name="%(app_label)s_%(class)s_bandwidth_pct_range",
                violation_error_message="The bandwidth limit is a percentage.",
            ),
        ]

    def __str__(self) -> str:
        return "watchdog thresholds"

    @classmethod
    def current(cls) -> Thresholds:
        row = cls.objects.order_by("pk").first()
        return row if row is not None else cls.objects.create()

    def as_rules(self) -> RuleThresholds:
        return RuleThresholds(**{f.name: getattr(self, f.name) for f in fields(RuleThresholds)})


class SliceWatch(models.Model):
    """What the watchdog remembers about a running slice between samples."""

    slice = models.OneToOneField(
        "tenants.Slice", on_delete=models.CASCADE, related_name="watch", verbose_name="slice"
    )
    over_quota_streak = models.PositiveSmallIntegerField("samples over quota in a row", default=0)
    last_active_at = models.DateTimeField("last compute activity", null=True, blank=True)
    idle_warned_at = models.DateTimeField("idle warning sent", null=True, blank=True)
    throttled_at = models.DateTimeField("throttled since", null=True, blank=True)
    drift_streak = models.PositiveSmallIntegerField(
        "samples with NVML and the quota library apart", default=0
    )

    class Meta:
        verbose_name = "slice watch"

    def __str__(self) -> str:
        return f"watch of slice {self.slice_id}"


# How the watchdog's closures of a GPU begin its `not_accepting_reason`: the breaker's lifts
# by itself once the card is below the reset line; a hardware fault's stays.
BREAKER_REASON = "VRAM breaker"
HARDWARE_REASON = "Hardware fault"


class GpuWatch(models.Model):
    """The 95% breaker's hold on a GPU (a drain for a hardware fault is the GPU's own
    reason, not kept here), and the orphans the sweep is counting."""

    gpu = models.OneToOneField(
        "nodes.Gpu", on_delete=models.CASCADE, related_name="watch", verbose_name="GPU"
    )
    breaker_open = models.BooleanField("closed by the 95% breaker", default=False)
    orphan_streaks = models.JSONField("orphan processes seen (pid: samples)", default=dict)

    class Meta:
        verbose_name = "GPU watch"

    def __str__(self) -> str:
        return f"watch of GPU {self.gpu_id}"


class WebhookEndpointQuerySet(models.QuerySet["WebhookEndpoint"]):
    def for_tenant(self, tenant: Tenant | None) -> WebhookEndpointQuerySet:
        if tenant is None:
            return self.none()
        return self.filter(tenant=tenant)


class WebhookEndpoint(models.Model):
    """Where incident notifications are POSTed, signed with HMAC-SHA256 of the body."""

    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="webhooks",
        verbose_name="tenant",
        help_text="Empty: an ops endpoint that receives every incident.",
    )
    url = models.URLField("URL", max_length=500)
    secret = models.CharField("signing secret", max_length=128)
    is_active = models.BooleanField("active", default=True)
    created_at = models.DateTimeField("created", auto_now_add=True)

    objects = WebhookEndpointQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        return self.url


class WebhookDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"

    endpoint = models.ForeignKey(
        "incidents.WebhookEndpoint",
        on_delete=models.CASCADE,
        related_name="deliveries",
        verbose_name="endpoint",
    )
    incident = models.ForeignKey(
        "incidents.Incident",
        on_delete=models.CASCADE,
        related_name="deliveries",
        verbose_name="incident",
    )
    event = models.CharField("event", max_length=32)
    payload = models.JSONField("payload")
    status = models.CharField(
        "status", max_length=16, choices=Status.choices, default=Status.PENDING
    )
    attempts = models.PositiveSmallIntegerField("attempts", default=0)
    response_status = models.PositiveSmallIntegerField("last HTTP status", null=True, blank=True)
    last_error = models.CharField("last error", max_length=500, blank=True)
    created_at = models.DateTimeField("created", auto_now_add=True)
    delivered_at = models.DateTimeField("delivered", null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "webhook delivery"

    def __str__(self) -> str:
        return f"{self.event} #{self.incident_id} -> {self.endpoint_id} ({self.status})"


class NeighbourHarm(models.Model):
    """A slice left short of its own quota because another container on its card was over
    its own: while the card held less free memory than the slice's unused quota. The
    evidence is the node agent's own NVML reading (never the quota library's books, which
    are tenant-writable); one row per harm, updated while it lasts. Its incident is the
    `neighbour_harm` one on target `harm:<node id>:<harm id>`."""

    node = models.ForeignKey(
        "nodes.Node", on_delete=models.CASCADE, related_name="+", verbose_name="node"
    )
    harm_id = models.CharField("agent's harm id", max_length=64)
    gpu = models.ForeignKey(
        "nodes.Gpu",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="GPU",
    )
    slice = models.ForeignKey(
        "tenants.Slice",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="harms",
        verbose_name="harmed slice",
    )
    container_id = models.CharField("harmed container", max_length=128)
    offender_containers = models.JSONField("offending containers", default=list)
    offender_slices = models.JSONField("offending slices", default=list, blank=True)
    offender_incidents = models.JSONField(
        "the offenders' incidents",
        default=list,
        blank=True,
        help_text="For ops: never shown to the harmed tenant.",
    )
    short_mb = models.PositiveIntegerField("most missing (MiB)")
    quota_mb = models.PositiveIntegerField("harmed slice's quota (MiB)", default=0)
    started_at = models.DateTimeField("began")
    ended_at = models.DateTimeField("ended", null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-pk"]
        verbose_name = "neighbour harm"
        constraints = [
            models.UniqueConstraint(
                fields=["node", "harm_id"],
                name="%(app_label)s_%(class)s_once",
                violation_error_message="The agent's harm is recorded once per node.",
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="%(app_label)s_%(class)s_ends_after_start",
                violation_error_message="A harm cannot end before it began.",
            ),
        ]
        indexes = [models.Index(fields=["-started_at"], name="incidents_harm_started_idx")]

    def __str__(self) -> str:
        return f"harm {self.harm_id} to {self.container_id[:12]}"

    @property
    def duration_s(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()
