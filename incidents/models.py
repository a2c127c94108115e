"""The incident ledger: one open incident per rule and target, with a runbook timeline."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q


class IncidentQuerySet(models.QuerySet):
    def for_tenant(self, tenant) -> "IncidentQuerySet":  # type: ignore[no-untyped-def]
        if tenant is None:
            return self.none()
        return self.filter(tenant=tenant)

    def open(self) -> "IncidentQuerySet":
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
        indexes = [
            models.Index(fields=["status", "-last_seen_at"], name="incidents_status_seen_idx"),
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
