"""Volumes: what a tenant keeps across a slice's stop. Each is a Docker volume on one node
(node-local storage), mounted into the tenant's slices on that node, billed per GB-hour
from the tenant's credit."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from .accounts import TenantScopedQuerySet

# Spelled here because Meta's constraints cannot see the class's attributes.
_KEPT_STATES = ("creating", "ready", "deleting")
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


class Volume(models.Model):
    class State(models.TextChoices):
        CREATING = "creating", "creating"
        READY = "ready", "ready"
        DELETING = "deleting", "deleting"
        DELETED = "deleted", "deleted"
        FAILED = "failed", "failed"

    KEPT_STATES = _KEPT_STATES

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="volumes", verbose_name="tenant"
    )
    node = models.ForeignKey(
        "nodes.Node", on_delete=models.PROTECT, related_name="+", verbose_name="node"
    )
    name = models.CharField("name", max_length=63)
    size_gb = models.PositiveIntegerField("size (GB)")
    docker_name = models.CharField("Docker volume", max_length=100, unique=True)
    state = models.CharField("state", max_length=16, choices=State.choices, default=State.CREATING)
    state_reason = models.CharField("state reason", max_length=500, blank=True)
    used_mb = models.PositiveBigIntegerField("used (MiB)", null=True, blank=True)
    used_measured_at = models.DateTimeField("usage measured", null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="+",
        verbose_name="created by",
    )
    created_at = models.DateTimeField("created", auto_now_add=True)
    ready_at = models.DateTimeField("ready", null=True, blank=True)
    deleted_at = models.DateTimeField("deleted", null=True, blank=True)
    last_metered_at = models.DateTimeField("metered up to", null=True, blank=True)
    unpaid_since = models.DateTimeField(
        "unpaid since",
        null=True,
        blank=True,
        help_text="When the tenant's credit first could not pay its storage; deleted after "
        "the grace period unless paid.",
    )
    warned_at = models.DateTimeField("deletion warned", null=True, blank=True)
    idempotency_key = models.CharField(
        "idempotency key",
        max_length=128,
        blank=True,
        help_text="A create retried with the same key returns this volume.",
    )
    idempotency_fingerprint = models.CharField(
        "request fingerprint",
        max_length=64,
        blank=True,
        help_text="SHA-256 of what the keyed request asked for: a replay must match it.",
    )

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]
        verbose_name = "volume"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="%(app_label)s_%(class)s_unique_idempotency_key",
                violation_error_message="A volume with this idempotency key already exists.",
            ),
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=Q(state__in=_KEPT_STATES),
                name="%(app_label)s_%(class)s_unique_name_per_tenant",
                violation_error_message="You already have a volume with this name.",
            ),
            models.CheckConstraint(
                condition=Q(size_gb__gte=1),
                name="%(app_label)s_%(class)s_size_positive",
                violation_error_message="A volume holds at least 1 GB.",
            ),
            models.CheckConstraint(
                condition=Q(name__regex=NAME_PATTERN),
                name="%(app_label)s_%(class)s_name_portable",
                violation_error_message="A volume name is a-z, 0-9, '.', '_' and '-'.",
            ),
        ]

    def __str__(self) -> str:
        return f"volume {self.name} ({self.state})"

    @property
    def owner_key(self) -> str:
        """The opaque key `nodes` labels the Docker volume with."""
        return f"volume-{self.pk}"


class SliceMount(models.Model):
    """One of a tenant's volumes mounted into a slice at a path of the tenant's choice."""

    slice = models.ForeignKey(
        "tenants.Slice", on_delete=models.CASCADE, related_name="mounts", verbose_name="slice"
    )
    volume = models.ForeignKey(
        "tenants.Volume", on_delete=models.PROTECT, related_name="mounts", verbose_name="volume"
    )
    path = models.CharField("mounted at", max_length=200)

    class Meta:
        ordering = ["path"]
        verbose_name = "volume mount"
        constraints = [
            models.UniqueConstraint(
                fields=["slice", "path"],
                name="%(app_label)s_%(class)s_one_volume_per_path",
                violation_error_message="Two volumes cannot be mounted at one path.",
            ),
            models.UniqueConstraint(
                fields=["slice", "volume"],
                name="%(app_label)s_%(class)s_volume_once_per_slice",
                violation_error_message="A volume is mounted once per slice.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.volume_id} at {self.path}"
