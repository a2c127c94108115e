"""The gateway's audit: every stream asked for, refused or opened, with who, where, how
long and how many bytes each way."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class GatewayStream(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="gateway_streams",
        verbose_name="user",
    )
    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="gateway_streams",
        verbose_name="tenant",
    )
    slice = models.ForeignKey(
        "tenants.Slice",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="gateway_streams",
        verbose_name="slice",
    )
    key_fingerprint = models.CharField("key fingerprint", max_length=64, blank=True)
    client_address = models.CharField("client address", max_length=64, blank=True)
    destination = models.CharField("destination asked for", max_length=255)
    port = models.PositiveIntegerField("port")
    refused = models.CharField(
        "refused because", max_length=300, blank=True, help_text="Empty: the stream opened."
    )
    opened_at = models.DateTimeField("asked at", auto_now_add=True)
    closed_at = models.DateTimeField("closed at", null=True, blank=True)
    closed_because = models.CharField("closed because", max_length=200, blank=True)
    bytes_up = models.PositiveBigIntegerField("bytes to the slice", default=0)
    bytes_down = models.PositiveBigIntegerField("bytes from the slice", default=0)

    class Meta:
        verbose_name = "gateway stream"
        ordering = ["-opened_at", "-id"]
        indexes = [models.Index(fields=["slice", "-opened_at"], name="gateway_stream_slice_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(port__gte=0) & Q(port__lte=65535),
                name="%(app_label)s_%(class)s_port_range",
                violation_error_message="A port is 0 to 65535.",
            )
        ]

    def __str__(self) -> str:
        what = "refused" if self.refused else "opened"
        return f"{self.destination}:{self.port} {what} for {self.user}"
