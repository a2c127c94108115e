"""The edge's records: every web terminal session and every stream through a port's
address (who, when, how long, bytes; never what was typed or sent), and the ports an
owner made public with a secret address."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


def _user() -> models.ForeignKey:
    return models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="user",
    )


def _slice() -> models.ForeignKey:
    return models.ForeignKey(
        "tenants.Slice",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="slice",
    )


def _tenant() -> models.ForeignKey:
    return models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="tenant",
    )


class TerminalSession(models.Model):
    """One web terminal opened (or refused) on a slice. The keystrokes are not kept."""

    user = _user()
    tenant = _tenant()
    slice = _slice()
    client_address = models.CharField("client address", max_length=64, blank=True)
    refused = models.CharField(
        "refused because", max_length=300, blank=True, help_text="Empty: the terminal opened."
    )
    opened_at = models.DateTimeField("opened at", auto_now_add=True)
    closed_at = models.DateTimeField("closed at", null=True, blank=True)
    closed_because = models.CharField("closed because", max_length=200, blank=True)

    class Meta:
        verbose_name = "web terminal session"
        ordering = ["-opened_at", "-id"]
        indexes = [models.Index(fields=["slice", "-opened_at"], name="edge_terminal_slice_idx")]

    def __str__(self) -> str:
        return f"terminal on slice {self.slice_id} for {self.user}"


class ProxyStream(models.Model):
    """One relay into a slice's port through its HTTPS address: a keep-alive HTTP
    connection or a WebSocket, by whom (none: through the port's public address), or a
    refused request."""

    class Via(models.TextChoices):
        SESSION = "session", "the platform's hand-off"
        TOKEN = "token", "an API token"  # noqa: S105 - a label, not a secret
        PUBLIC = "public", "the port's public address"

    user = _user()
    tenant = _tenant()
    slice = _slice()
    port = models.PositiveIntegerField("port")
    via = models.CharField("let in by", max_length=8, choices=Via.choices, blank=True)
    websocket = models.BooleanField("WebSocket", default=False)
    client_address = models.CharField("client address", max_length=64, blank=True)
    host = models.CharField("address asked for", max_length=255, blank=True)
    refused = models.CharField(
        "refused because", max_length=300, blank=True, help_text="Empty: the stream opened."
    )
    opened_at = models.DateTimeField("opened at", auto_now_add=True)
    closed_at = models.DateTimeField("closed at", null=True, blank=True)
    closed_because = models.CharField("closed because", max_length=200, blank=True)
    bytes_up = models.PositiveBigIntegerField("bytes to the slice", default=0)
    bytes_down = models.PositiveBigIntegerField("bytes from the slice", default=0)

    class Meta:
        verbose_name = "port address stream"
        ordering = ["-opened_at", "-id"]
        indexes = [models.Index(fields=["slice", "-opened_at"], name="edge_stream_slice_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(port__gte=0) & Q(port__lte=65535),
                name="%(app_label)s_%(class)s_port_range",
                violation_error_message="A port is 0 to 65535.",
            )
        ]

    def __str__(self) -> str:
        return f"slice {self.slice_id} port {self.port} ({self.via or 'refused'})"


class PublicPort(models.Model):
    """A port an owner made public: anyone holding its address (which carries the secret)
    reaches it. Only the secret's SHA-256 is kept; rotating makes a new row and revokes the
    old one."""

    slice = models.ForeignKey(
        "tenants.Slice", on_delete=models.CASCADE, related_name="public_ports"
    )
    port = models.PositiveIntegerField("port")
    secret_hash = models.CharField("secret (SHA-256)", max_length=64, unique=True)
    created_by = _user()
    created_at = models.DateTimeField("made public at", auto_now_add=True)
    revoked_at = models.DateTimeField("revoked at", null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="revoked by",
    )

    class Meta:
        verbose_name = "public port"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["slice", "port"],
                condition=Q(revoked_at__isnull=True),
                name="edge_one_public_secret_per_port",
                violation_error_message="This port already has a public address.",
            ),
            models.CheckConstraint(
                condition=Q(port__gte=1) & Q(port__lte=65535),
                name="%(app_label)s_%(class)s_port_range",
                violation_error_message="A port is 1 to 65535.",
            ),
        ]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "public"
        return f"slice {self.slice_id} port {self.port} ({state})"
