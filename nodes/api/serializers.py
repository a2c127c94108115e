"""Serializers for the fleet API (ops only)."""

from typing import Any

from django.contrib.auth.models import User
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail

from gpuplatform.api.serializers import StrictSerializer
from gpuplatform.datetimes import range_code, to_utc
from nodes import preflight, ssh
from nodes.allowlist import allowlisted_images
from nodes.models import Gpu, Node, NodePolicy, NodePolicyChange


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField[Node](slug_field="name", read_only=True)
    allocated_mb = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "node",
            "index",
            "uuid",
            "model",
            "vram_total_mb",
            "allocated_mb",
            "last_memory_used_mb",
            "last_utilization_gpu",
            "last_utilization_memory",
            "last_temperature_c",
            "last_power_w",
            "last_sample_at",
            "mig_capable",
            "mig_enabled",
            "mig_devices",
            "overcommit_ratio",
            "accepting_placements",
            "not_accepting_reason",
            "whole_card_only",
            "present",
        ]
        read_only_fields = fields


class NodeGpuSerializer(GpuSerializer):
    class Meta(GpuSerializer.Meta):
        fields = [f for f in GpuSerializer.Meta.fields if f != "node"]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    gpus = NodeGpuSerializer(many=True, read_only=True)
    pending_host_key_fingerprint = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "address",
            "port",
            "ssh_user",
            "container_network",
            "access",
            "status",
            "status_reason",
            "host_key_fingerprint",
            "pending_host_key_fingerprint",
            "capabilities",
            "driver_version",
            "cuda_version",
            "sample_source",
            "last_seen_at",
            "consecutive_failures",
            "last_error",
            "last_error_at",
            "drained_at",
            "drain_reason",
            "gate_status",
            "gate_reason",
            "gate_checked_at",
            "preflight",
            "watchdog_only_accepted_at",
            "watchdog_only_reason",
            "created_at",
            "gpus",
        ]
        read_only_fields = fields

    def get_pending_host_key_fingerprint(self, node: Node) -> str | None:
        return ssh.fingerprint(node.pending_host_key) if node.pending_host_key else None


class NodeCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=63)
    address = serializers.CharField(max_length=255)
    port = serializers.IntegerField(min_value=1, max_value=65535, default=22)
    ssh_user = serializers.CharField(max_length=32, default="gpuplatform")
    container_network = serializers.CharField(
        max_length=64,
        default="bridge",
        help_text="Docker network slices join: bridge (ports published) or none.",
    )
    access = serializers.ChoiceField(
        choices=Node.Access.choices,
        default=Node.Access.GATEWAY,
        help_text="gateway: through the platform's SSH gateway, nothing published; "
        "direct: ports published on the node's address.",
    )
    host_key = serializers.CharField(
        max_length=4096,
        required=False,
        allow_blank=True,
        default="",
        help_text="A known_hosts line you trust. Empty: the key is read for approval.",
    )


class NodeUpdateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=63, required=False)
    address = serializers.CharField(max_length=255, required=False)
    port = serializers.IntegerField(min_value=1, max_value=65535, required=False)
    ssh_user = serializers.CharField(max_length=32, required=False)
    container_network = serializers.CharField(max_length=64, required=False)
    access = serializers.ChoiceField(choices=Node.Access.choices, required=False)
    host_key = serializers.CharField(max_length=4096, required=False, allow_blank=True)


class ApproveHostKeySerializer(StrictSerializer):
    fingerprint = serializers.CharField(
        max_length=128, help_text="The SHA256 fingerprint shown for the pending key."
    )


class DrainSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class SeriesQuerySerializer(StrictSerializer):
    query_string = True  # ?max_points=100 is text: read as DRF reads it

    start = serializers.DateTimeField(required=False, help_text="Default: 1 hour ago.")
    end = serializers.DateTimeField(required=False, help_text="Default: now.")
    max_points = serializers.IntegerField(min_value=10, max_value=500, default=500)
    format = serializers.CharField(required=False)  # DRF's own ?format=

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for name in ("start", "end"):
            if attrs.get(name) is not None:
                try:
                    attrs[name] = to_utc(attrs[name])
                except ValueError as exc:
                    raise serializers.ValidationError(
                        {name: [ErrorDetail(str(exc), code=range_code(attrs[name]))]}
                    ) from None
        if attrs.get("start") and attrs.get("end") and attrs["start"] >= attrs["end"]:
            raise serializers.ValidationError({"start": ["start must be before end."]})
        return attrs


class SeriesPointSerializer(serializers.Serializer):
    t = serializers.DateTimeField()
    used_mb = serializers.FloatField()
    used_max_mb = serializers.FloatField()
    util = serializers.FloatField(allow_null=True)


class SeriesSerializer(serializers.Serializer):
    gpu = serializers.IntegerField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    memory_total_mb = serializers.IntegerField()
    points = SeriesPointSerializer(many=True)


class RecommendedRatioSerializer(serializers.Serializer):
    ratio = serializers.DecimalField(
        max_digits=4,
        decimal_places=2,
        allow_null=True,
        help_text="The highest ratio allowed; null without 7 days of samples, or on MIG.",
    )
    reason = serializers.CharField()
    days_of_history = serializers.FloatField()
    peak_mb = serializers.IntegerField(allow_null=True)


class GpuPolicySerializer(serializers.Serializer):
    gpu = serializers.IntegerField(source="pk")
    node = serializers.CharField(source="node.name")
    index = serializers.IntegerField()
    vram_total_mb = serializers.IntegerField()
    allocated_mb = serializers.IntegerField()
    mig_enabled = serializers.BooleanField()
    overcommit_ratio = serializers.DecimalField(max_digits=4, decimal_places=2)
    accepting_placements = serializers.BooleanField()
    not_accepting_reason = serializers.CharField()
    recommended = RecommendedRatioSerializer()


class GpuPolicyUpdateSerializer(StrictSerializer):
    overcommit_ratio = serializers.DecimalField(
        max_digits=5,
        decimal_places=2,
        required=False,
        help_text="1.00 to 4.00; above 1.00 only up to the recommended ratio.",
    )
    accepting_placements = serializers.BooleanField(required=False)
    reason = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        default="",
        help_text="Why the GPU stops taking placements (required when closing it).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "overcommit_ratio" not in attrs and "accepting_placements" not in attrs:
            raise serializers.ValidationError(
                "Give overcommit_ratio, accepting_placements, or both."
            )
        return attrs


class WatchdogOnlySerializer(StrictSerializer):
    accept = serializers.BooleanField(
        help_text="true: sell this node's non-MIG GPUs in slices with the watchdog as the "
        "only VRAM enforcement; false: whole cards only until a quota library is proven."
    )
    reason = serializers.CharField(max_length=500)


class KnownBuildSerializer(StrictSerializer):
    component = serializers.ChoiceField(choices=["runc", "toolkit"])
    build = serializers.CharField(max_length=100)
    reason = serializers.CharField(max_length=300)


class NodePolicySerializer(serializers.ModelSerializer):
    probe_image_choices = serializers.SerializerMethodField(
        help_text="The allowlisted images `probe_image` may be set to (as each runs)."
    )

    class Meta:
        model = NodePolicy
        fields = [*preflight.POLICY_FIELDS, "probe_image_choices", "updated_at"]
        read_only_fields = fields

    def get_probe_image_choices(self, policy: NodePolicy) -> list[str]:
        return [image.reference for image in allowlisted_images()]


class NodePolicyUpdateSerializer(StrictSerializer):
    """Shapes only; the rules (version grammar, reserved names) are the service's."""

    min_toolkit_version = serializers.CharField(max_length=32, required=False)
    min_runc_version = serializers.CharField(max_length=32, required=False)
    driver_branches = serializers.ListField(
        child=serializers.CharField(max_length=8), required=False, max_length=32
    )
    known_fixed_builds = KnownBuildSerializer(many=True, required=False)
    probe_image = serializers.CharField(
        max_length=255, required=False, help_text="One of `probe_image_choices`."
    )
    probe_command = serializers.ListField(
        child=serializers.CharField(max_length=4096), required=False, max_length=64
    )
    probe_environment = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True), required=False
    )
    require_userns_remap = serializers.BooleanField(required=False)
    reason = serializers.CharField(max_length=500, help_text="Why: kept with the change.")


class NodePolicyChangeSerializer(serializers.ModelSerializer):
    changed_by = serializers.SlugRelatedField[User](slug_field="username", read_only=True)
    node = serializers.SlugRelatedField[Node](
        slug_field="name", read_only=True, allow_null=True, help_text="null: a fleet-wide change."
    )

    class Meta:
        model = NodePolicyChange
        fields = ["id", "changed_at", "changed_by", "node", "field", "old_value", "new_value",
                  "reason"]  # fmt: skip
        read_only_fields = fields


class ReservedVariableSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="A name, or a prefix ending in *.")
    kind = serializers.ChoiceField(choices=["name", "prefix"])
    reason = serializers.CharField()
    image_may_set = serializers.CharField(
        help_text="Why an image's own configuration may keep it ('' when it may not)."
    )
