"""Serializers of the slices API: images, slices, their transitions, runs and VRAM series.

Output serializers only read; input serializers (StrictSerializer) check shapes and types
and leave the rules (allowlist, environment names, the estimate) to the services."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuplatform.api.serializers import StrictSerializer
from tenants import selectors
from tenants.models import (
    Image,
    LaunchTemplate,
    Purchase,
    Slice,
    SliceRun,
    SliceTransition,
)
from tenants.permissions import redact_for_viewers
from tenants.ssh_host_keys import host_key_fingerprint

from .volumes import MountSerializer


class ImageSerializer(serializers.ModelSerializer):
    pinned_reference = serializers.CharField(
        read_only=True, help_text="What a launch runs: reference@digest when pinned."
    )
    on_nodes = serializers.SerializerMethodField(
        help_text="How many nodes taking slices now hold the image (by their last listing "
        "of their images); 0: a launch would need the node to pull it."
    )
    available = serializers.SerializerMethodField(
        help_text="Whether some node taking slices now holds the image (on_nodes > 0)."
    )

    def _on_nodes(self, image: Image) -> int:
        # the view counts a page of images at once; one image alone is counted here
        counted = self.context.get("on_nodes")
        if counted is None or image.pk not in counted:
            counted = selectors.images_on_nodes([image])
        return counted[image.pk]

    @extend_schema_field(OpenApiTypes.INT)
    def get_on_nodes(self, image: Image) -> int:
        return self._on_nodes(image)

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_available(self, image: Image) -> bool:
        return self._on_nodes(image) > 0

    class Meta:
        model = Image
        fields = [
            "id",
            "name",
            "reference",
            "digest",
            "pinned_reference",
            "description",
            "default_command",
            "ports",
            "connect",
            "ssh_user",
            "on_nodes",
            "available",
        ]
        read_only_fields = fields


class OpsImageSerializer(ImageSerializer):
    class Meta(ImageSerializer.Meta):
        fields = [
            *ImageSerializer.Meta.fields,
            "is_active",
            "inspected_at",
            "inspected_on",
            "inspected_image_id",
            "inspection_note",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class ImageWriteSerializer(StrictSerializer):
    """Shapes only; the allowlist rules (reference grammar, ports per connection kind)
    are the service's."""

    name = serializers.CharField(max_length=64)
    reference = serializers.CharField(max_length=255)
    digest = serializers.CharField(max_length=71, required=False, allow_blank=True)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)
    default_command = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True),
        required=False,
        help_text="argv, run without a shell.",
    )
    ports = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=65535), required=False
    )
    connect = serializers.ChoiceField(choices=Image.Connect.choices, required=False)
    ssh_user = serializers.CharField(
        max_length=32, required=False, help_text="The user the image's sshd logs in (root)."
    )
    is_active = serializers.BooleanField(required=False)


class SliceTransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = SliceTransition
        fields = ["from_state", "to_state", "reason", "at"]
        read_only_fields = fields


class SliceRunSerializer(serializers.ModelSerializer):
    """One run of a slice (its launch, then one per resume): where it ran, its container,
    its times, how it ended, and its minutes and cost on the purchase that paid for it."""

    connection = serializers.JSONField(
        read_only=True, help_text="How it was reached (kind, host, ports, user); no secrets."
    )
    cost = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        read_only=True,
        help_text="Its minutes at its own purchase's price per minute (credits).",
    )

    class Meta:
        model = SliceRun
        fields = [
            "number",
            "purchase",
            "interruptible",
            "guaranteed",
            "vram_mb",
            "node_name",
            "gpu_label",
            "gpu_model",
            "mig_device_uuid",
            "container_id",
            "connection",
            "requested_at",
            "started_at",
            "ended_at",
            "end_state",
            "end_reason",
            "exit_code",
            "ended_by",
            "minutes",
            "cost",
            "peak_vram_mb",
        ]
        read_only_fields = fields


ESTIMATE_SUMMARY_KEYS = (
    "workload",
    "engine",
    "weights_dtype",
    "kv_cache_dtype",
    "terms",
    "total_mib",
    "tier_mib",
    "usable_mib",
    "fits",
    "smallest_fitting_tier_mib",
    "suggestions",
    "notes",
)


def estimate_summary(estimate: dict[str, Any] | None) -> dict[str, Any] | None:
    if not estimate:
        return None
    out = {key: estimate[key] for key in ESTIMATE_SUMMARY_KEYS if key in estimate}
    model = estimate.get("model") or {}
    out["model"] = model.get("name") if isinstance(model, dict) else None
    return out


class SliceSerializer(serializers.ModelSerializer):
    """A slice as lists show it: no query beyond the list's own."""

    tier_name = serializers.CharField(source="purchase.tier.name", read_only=True)
    image = serializers.IntegerField(source="image_entry_id", read_only=True, allow_null=True)
    image_name = serializers.CharField(source="image_entry.name", read_only=True, default=None)
    image_reference = serializers.CharField(source="image", read_only=True)
    vram_mb = serializers.IntegerField(
        read_only=True,
        help_text="Its tier's VRAM (MiB): its quota, unless a MIG instance gives it more "
        "(a slice's `vram_quota`).",
    )
    peak_vram_mb = serializers.IntegerField(
        source="peak_mb",
        read_only=True,
        allow_null=True,
        help_text="The highest VRAM (MiB) its container held in one sample: while it runs, "
        "the peak so far; null before any sample.",
    )
    minutes_used = serializers.SerializerMethodField(
        help_text="Minutes it has run, up to date while it runs: those metered plus the whole "
        "minutes since, which the next minute tick charges (docs/billing.md)."
    )
    minutes_metered = serializers.IntegerField(
        source="minutes_used",
        read_only=True,
        help_text="Minutes charged to its purchases so far (the meter's count, which lags "
        "a running slice by up to two minutes).",
    )

    class Meta:
        model = Slice
        fields = [
            "id",
            "state",
            "state_reason",
            "purchase",
            "tier_name",
            "image",
            "image_name",
            "image_reference",
            "vram_mb",
            "guaranteed",
            "estimate_mb",
            "minutes_used",
            "minutes_metered",
            "peak_vram_mb",
            "exit_code",
            "created_at",
            "queued_at",
            "started_at",
            "stopped_at",
            "terminated_at",
            "runs",
        ]
        read_only_fields = fields

    def get_minutes_used(self, slice: Slice) -> int:
        return selectors.slice_minutes_shown(slice=slice)


class VramQuotaSerializer(serializers.Serializer):
    quota_mb = serializers.IntegerField(
        help_text="What the watchdog holds the slice to (MiB): its tier's VRAM, or on a MIG "
        "instance that gives more, the instance's memory (a hardware partition: all of it "
        "the slice's to use)."
    )
    tier_mb = serializers.IntegerField(help_text="Its tier's VRAM (MiB).")
    mig_profile = serializers.CharField(
        allow_null=True, help_text="The MIG instance it runs on (1g.10gb); null off MIG."
    )
    mig_instance_mb = serializers.IntegerField(
        allow_null=True, help_text="What that MIG instance gives (MiB); null off MIG."
    )


class SliceDetailSerializer(SliceSerializer):
    queue_position = serializers.SerializerMethodField(
        help_text="1 for the next queued slice of its tier; null when not queued."
    )
    vram_quota = serializers.SerializerMethodField()
    transitions = serializers.SerializerMethodField()
    estimate = serializers.SerializerMethodField()
    model = serializers.JSONField(source="model_request", read_only=True)
    ssh_host_key_public = serializers.CharField(
        read_only=True,
        help_text="The slice's own SSH host key (an OpenSSH public key line), the same on "
        'every run; "" for an image without its own sshd. The private half is never shown.',
    )
    ssh_host_key_fingerprint = serializers.SerializerMethodField(
        help_text='That key\'s fingerprint as `ssh-keygen -l` prints it (SHA256:...); "" '
        "when there is none."
    )
    image_policy = serializers.CharField(
        read_only=True,
        help_text="For an image you brought (on no allowlist): the registry policy's mode "
        'that let it run, "registry" or "any"; "" for an allowlisted image.',
    )
    image_digest = serializers.CharField(
        read_only=True,
        help_text="For an image you brought: the digest every start runs (its first start's "
        'pull resolved it, or you named it); "" before its first start.',
    )
    declared_ports = serializers.ListField(
        child=serializers.IntegerField(),
        read_only=True,
        help_text="The ports the image declares: the allowlist entry's, or the ones a "
        "brought image's configuration exposes (read at its start).",
    )

    class Meta(SliceSerializer.Meta):
        fields = [
            *SliceSerializer.Meta.fields,
            "image_policy",
            "image_digest",
            "declared_ports",
            "ssh_host_key_public",
            "ssh_host_key_fingerprint",
            "queue_position",
            "vram_quota",
            "connection",
            "estimate",
            "model",
            "command",
            "environment",
            "ssh_public_key",
            "template",
            "engine",
            "engine_args",
            "transitions",
        ]
        read_only_fields = fields

    def get_queue_position(self, slice: Slice) -> int | None:
        return selectors.queue_position(slice)

    def get_ssh_host_key_fingerprint(self, slice: Slice) -> str:
        return host_key_fingerprint(slice.ssh_host_key_public)

    @extend_schema_field(VramQuotaSerializer)
    def get_vram_quota(self, slice: Slice) -> dict[str, Any]:
        quota = selectors.slice_vram_quota(slice)
        instance = quota.instance
        return {
            "quota_mb": quota.mb,
            "tier_mb": quota.tier_mb,
            "mig_profile": instance.profile if instance else None,
            "mig_instance_mb": instance.memory_mb if instance else None,
        }

    @extend_schema_field(SliceTransitionSerializer(many=True))
    def to_representation(self, instance: Slice) -> dict[str, Any]:
        data = super().to_representation(instance)
        request = self.context.get("request")
        user = getattr(request, "user", None)
        if user is not None and user.is_staff:
            return data
        return redact_for_viewers(data, getattr(request, "membership", None))

    def get_transitions(self, slice: Slice) -> list[dict]:
        # many=True makes a list serializer, whose data is a list: the stubs type it as one
        # object's.
        transitions = SliceTransitionSerializer(selectors.slice_transitions(slice=slice), many=True)
        return transitions.data  # type: ignore[return-value]

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_estimate(self, slice: Slice) -> dict | None:
        return estimate_summary(slice.estimate)


class OpsSliceSerializer(SliceSerializer):
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)
    node = serializers.SerializerMethodField()
    gpu_index = serializers.SerializerMethodField()

    class Meta(SliceSerializer.Meta):
        fields = [
            "id",
            "tenant",
            "tenant_name",
            *SliceSerializer.Meta.fields[1:],
            "node",
            "gpu_index",
        ]
        read_only_fields = fields

    def get_node(self, slice: Slice) -> str | None:
        return slice.allocation.gpu.node.name if slice.allocation_id else None  # type: ignore[union-attr]

    def get_gpu_index(self, slice: Slice) -> int | None:
        return slice.allocation.gpu.index if slice.allocation_id else None  # type: ignore[union-attr]


@extend_schema_field(OpenApiTypes.INT)
class _TenantPurchaseField(serializers.PrimaryKeyRelatedField):
    """A purchase of the caller's tenant. Another tenant's id reads exactly like one that
    does not exist, so the answer leaks nothing."""

    def get_queryset(self) -> QuerySet[Purchase]:
        return Purchase.objects.for_tenant(self.context.get("tenant"))


class SliceCreateSerializer(StrictSerializer):
    purchase = _TenantPurchaseField(help_text="One of your purchases with minutes left.")
    template = serializers.PrimaryKeyRelatedField(
        queryset=LaunchTemplate.objects.filter(is_active=True),
        required=False,
        allow_null=True,
        default=None,
        help_text="A launch template's id (GET /templates/): its image, command, environment "
        "and job are the defaults, and its engine is told the slice's budget at start.",
    )
    image = serializers.PrimaryKeyRelatedField(
        queryset=Image.objects.all(),
        required=False,
        help_text="An allowlisted image's id (GET /images/); with a template, its image.",
    )
    image_reference = serializers.CharField(
        max_length=255,
        required=False,
        allow_blank=True,
        default="",
        help_text="Instead of `image`: an image reference, e.g. ghcr.io/acme/train:2. An "
        "allowlisted one runs as its entry; one on no allowlist runs where the registry "
        "policy lets renters bring it (403 `image_not_allowed` naming the rule otherwise), "
        "pulled at every start with your tenant's own registry login and run by digest "
        "(docs/images.md).",
    )
    model = serializers.JSONField(
        required=False,
        help_text='The job, for the VRAM check, e.g. {"model": {"catalog": '
        '"Qwen/Qwen2.5-1.5B"}, "weights_dtype": "bf16", "context_tokens": 4096}. '
        "The tier comes from the purchase; with a template, what is given goes over its "
        "job, key by key.",
    )
    command = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True),
        required=False,
        help_text="argv, run without a shell; empty: the template's, else the image's default.",
    )
    environment = serializers.DictField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True),
        required=False,
        default=dict,
        help_text="Added to (and over) the template's.",
    )
    ssh_public_key = serializers.CharField(
        max_length=16384, required=False, allow_blank=True, default=""
    )
    guaranteed = serializers.BooleanField(
        default=True, help_text="Never on an overcommitted GPU (the default)."
    )
    volumes = MountSerializer(
        many=True,
        required=False,
        default=list,
        help_text='Your volumes to mount, e.g. [{"volume": 3, "path": "/data"}]: the '
        "slice then runs on their node.",
    )

    # Without a template the image and the job are required, and a template's defaults
    # are merged under what is given: the launch service's rules (LaunchRequest), the same
    # for the page.


class SliceStopSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class OpsSliceStopSerializer(SliceStopSerializer):
    force = serializers.BooleanField(
        default=False, help_text="Kill the container without the grace period."
    )


class VramPointSerializer(serializers.Serializer):
    t = serializers.DateTimeField()
    used_mb = serializers.IntegerField()


class SliceVramSerializer(serializers.Serializer):
    slice = serializers.IntegerField()
    quota_mb = serializers.IntegerField(
        help_text="What the watchdog holds the slice to (MiB): its tier's VRAM, or its MIG "
        "instance's memory where that is more."
    )
    peak_mb = serializers.IntegerField(allow_null=True)
    points = VramPointSerializer(many=True)
