"""Serializers for the incidents API.

Ops read the whole ledger entry (where, who, evidence, timeline); a tenant reads a
reduced one about their own slice: no node, GPU, other tenants or process lists, and
the plain-words explanation instead. Input serializers (StrictSerializer) check shapes
and types only; the rules stay in incidents.services.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import User
from django.core.validators import URLValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuplatform.api.serializers import StrictModelSerializer, StrictSerializer
from incidents import notify, selectors
from incidents.models import Incident, IncidentEvent, Thresholds, WebhookDelivery, WebhookEndpoint

MAX_ID = 2**31 - 1  # the largest primary key PostgreSQL's integer holds

# --- incidents ------------------------------------------------------------------------------


class TenantIncidentSerializer(serializers.ModelSerializer):
    explanation = serializers.SerializerMethodField(
        help_text="What happened to your slice, in plain words, and what to change."
    )
    title = serializers.SerializerMethodField(help_text="What happened, naming no node or GPU.")
    slices = serializers.SerializerMethodField(
        help_text="Your slices it is about, or touched (a machine that stopped answering)."
    )

    class Meta:
        model = Incident
        fields = [
            "id",
            "slice",
            "slices",
            "title",
            "severity",
            "status",
            "root_cause",
            "first_seen_at",
            "last_seen_at",
            "resolved_at",
            "explanation",
        ]
        read_only_fields = fields

    def get_explanation(self, incident: Incident) -> str:
        return notify.tenant_text(incident)

    def get_title(self, incident: Incident) -> str:
        return notify.tenant_title(incident)

    def get_slices(self, incident: Incident) -> list[int]:
        tenant = self.context.get("tenant")
        return notify.tenant_slices(incident, tenant.pk) if tenant is not None else []


class OpsIncidentSerializer(serializers.ModelSerializer):
    tenant_name = serializers.CharField(source="tenant.name", read_only=True, allow_null=True)
    node_name = serializers.SerializerMethodField(
        help_text="The incident's node, or its GPU's node."
    )
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True, allow_null=True)
    # null until someone acknowledges or resolves it (and again once it is reopened)
    acknowledged_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="email", read_only=True, allow_null=True
    )
    resolved_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="email", read_only=True, allow_null=True
    )

    class Meta:
        model = Incident
        fields = [
            "id",
            "rule",
            "target_key",
            "title",
            "root_cause",
            "severity",
            "status",
            "tenant",
            "tenant_name",
            "slice",
            "node",
            "node_name",
            "gpu",
            "gpu_uuid",
            "first_seen_at",
            "last_seen_at",
            "occurrences",
            "acknowledged_by",
            "acknowledged_at",
            "resolved_by",
            "resolved_at",
            "resolution_note",
        ]
        read_only_fields = fields

    def get_node_name(self, incident: Incident) -> str | None:
        if incident.node is not None:
            return incident.node.name
        if incident.gpu is not None:
            return incident.gpu.node.name
        return None


class IncidentEventSerializer(serializers.ModelSerializer):
    actor = serializers.SerializerMethodField(help_text="The ops user's email, or `system`.")

    class Meta:
        model = IncidentEvent
        fields = ["id", "kind", "message", "actor", "data", "at"]
        read_only_fields = fields

    def get_actor(self, event: IncidentEvent) -> str:
        return event.actor.email if event.actor is not None else "system"


class OpsIncidentDetailSerializer(OpsIncidentSerializer):
    timeline = serializers.SerializerMethodField(
        help_text="The runbook's steps and every action, oldest first."
    )

    class Meta(OpsIncidentSerializer.Meta):
        fields = [*OpsIncidentSerializer.Meta.fields, "evidence", "timeline"]
        read_only_fields = fields

    @extend_schema_field(IncidentEventSerializer(many=True))
    def get_timeline(self, incident: Incident) -> list[dict[str, Any]]:
        events = selectors.incident_timeline(incident=incident)
        # many=True makes a ListSerializer, whose data is a list: the stubs type the class
        return IncidentEventSerializer(events, many=True).data  # type: ignore[return-value]


class NoInputSerializer(StrictSerializer):
    """An action that takes no fields: anything sent is refused by name."""


class ResolveSerializer(StrictSerializer):
    note = serializers.CharField(max_length=2000, help_text="How it was resolved.")


class ReopenSerializer(StrictSerializer):
    note = serializers.CharField(max_length=400, required=False, allow_blank=True, default="")


class ActionReasonSerializer(StrictSerializer):
    """Stop the incident's slice, drain its GPU or its node: the call is the confirmation."""

    reason = serializers.CharField(
        max_length=300, help_text="Recorded on the incident's timeline (and the slice's)."
    )


class AcknowledgeManySerializer(StrictSerializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        allow_empty=False,
        max_length=500,
        help_text="Incident ids; resolved ones and ids that do not exist are skipped.",
    )


class AcknowledgedSerializer(serializers.Serializer):
    acknowledged = serializers.IntegerField(
        help_text="How many were open and are now acknowledged."
    )


# --- thresholds -----------------------------------------------------------------------------

THRESHOLD_FIELDS = [
    "vram_warning_pct",
    "vram_critical_pct",
    "breaker_reset_pct",
    "process_jump_mb",
    "sweep_high_pct",
    "sweep_rise_mb",
    "sweep_window_s",
    "leak_window_s",
    "leak_min_growth_mb",
    "idle_after_s",
    "idle_stop_after_s",
    "bandwidth_pct",
    "quota_grace_samples",
    "orphan_confirm_samples",
    "unattributed_mb",
]
PERCENT = {"min_value": 0, "max_value": 100}


class ThresholdsSerializer(serializers.ModelSerializer):
    updated_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="email", read_only=True, allow_null=True
    )

    class Meta:
        model = Thresholds
        fields = [*THRESHOLD_FIELDS, "updated_at", "updated_by"]
        read_only_fields = fields


class ThresholdsUpdateSerializer(StrictModelSerializer):
    """Any subset of the thresholds; the ordering rules are the service's."""

    class Meta:
        model = Thresholds
        fields = THRESHOLD_FIELDS
        extra_kwargs = {
            name: PERCENT
            for name in THRESHOLD_FIELDS
            if name.endswith("_pct")  # a percentage, whatever the ordering rules say
        }


# --- webhooks -------------------------------------------------------------------------------


def _refuse_private_host(url: str) -> None:
    """A tenant's endpoint may not point the platform at itself or its private network."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        raise serializers.ValidationError("Use a public address, not localhost.")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return
    if not address.is_global:
        raise serializers.ValidationError("Use a public address, not a private or local one.")


class WebhookEndpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "is_active", "created_at"]
        read_only_fields = fields


class WebhookEndpointCreatedSerializer(WebhookEndpointSerializer):
    secret = serializers.CharField(
        read_only=True,
        help_text="Shown once, now: verify each delivery's X-Gpuplatform-Signature, "
        'HMAC-SHA256 of "<X-Gpuplatform-Timestamp>.<body>" with it.',
    )

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookEndpointCreateSerializer(StrictSerializer):
    url = serializers.URLField(
        max_length=500,
        validators=[URLValidator(schemes=["http", "https"])],
        help_text="Where incident notifications are POSTed (http or https).",
    )

    def validate_url(self, value: str) -> str:
        if self.context.get("for_tenant"):
            _refuse_private_host(value)
        return value


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """For a tenant's own endpoint the transport error is reduced to its kind: the
    platform's network must not be mapped through error texts (ops see it all)."""

    def to_representation(self, instance: WebhookDelivery) -> dict[str, Any]:
        data = super().to_representation(instance)
        if instance.endpoint.tenant_id is not None and data.get("last_error"):
            data["last_error"] = (
                f"the endpoint answered HTTP {data['response_status']}"
                if data.get("response_status")
                else "the endpoint could not be reached"
            )
        return data

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "incident",
            "event",
            "status",
            "attempts",
            "response_status",
            "last_error",
            "created_at",
            "delivered_at",
        ]
        read_only_fields = fields
