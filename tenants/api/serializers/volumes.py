"""Volumes in the API: a tenant's own (create, list, delete with its name as the
confirmation), the mounts of a launch, the resume and terminate of a slice, and what a
slice printed (its logs, read with a cursor)."""

from __future__ import annotations

from rest_framework import serializers

from gpuplatform.api.serializers import StrictSerializer
from nodes import volumes as node_volumes
from tenants.models import Volume
from tenants.services.volumes import MIB_PER_GB


class VolumeSerializer(serializers.ModelSerializer):
    # The name only: where its slices run, never how the platform reaches the node.
    node = serializers.CharField(
        source="node.name",
        read_only=True,
        help_text="The node it lives on: every slice that mounts it runs there.",
    )
    used_gb = serializers.SerializerMethodField(
        help_text="What it holds, in GB, as last measured (null until measured)."
    )

    class Meta:
        model = Volume
        fields = ["id", "name", "node", "size_gb", "state", "state_reason", "used_gb",
                  "used_measured_at", "created_at", "ready_at", "deleted_at",
                  "unpaid_since"]  # fmt: skip
        read_only_fields = fields

    def get_used_gb(self, volume: Volume) -> float | None:
        return None if volume.used_mb is None else round(volume.used_mb / MIB_PER_GB, 2)


class VolumeCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=63, help_text="a-z, 0-9, '.', '_' and '-'.")
    size_gb = serializers.IntegerField(help_text="Whole GB (the node measures what it holds).")


class VolumeDeleteSerializer(StrictSerializer):
    confirm = serializers.CharField(
        max_length=63, help_text="The volume's name, typed: its files are deleted for good."
    )


class MountSerializer(StrictSerializer):
    volume = serializers.IntegerField(help_text="One of your ready volumes.")
    path = serializers.CharField(
        max_length=200,
        help_text=f"Where it appears: under {' or '.join(node_volumes.MOUNT_ROOTS)}.",
    )


class SliceResumeSerializer(StrictSerializer):
    purchase = serializers.IntegerField(
        required=False,
        help_text="One of your purchases of the slice's tier with minutes left. Left out: "
        "the slice's own when it has minutes left and is free, else a full-price one before "
        "an interruptible one, the oldest first (the resume page preselects the same).",
    )


class SliceTerminateSerializer(StrictSerializer):
    delete_volumes = serializers.BooleanField(
        required=False, default=False, help_text="Also delete the volumes only this slice used."
    )


class SliceLogsQuerySerializer(StrictSerializer):
    query_string = True

    after = serializers.IntegerField(
        min_value=0, required=False, default=0, help_text="The cursor: lines after this one."
    )
    limit = serializers.IntegerField(
        min_value=1, max_value=1000, required=False, default=200, help_text="At most 1000."
    )


class SliceLogLineSerializer(serializers.Serializer):
    seq = serializers.IntegerField(help_text="The line's number (the cursor).")
    at = serializers.DateTimeField(help_text="When the container printed it (docker's time).")
    text = serializers.CharField(help_text="The line, terminal escapes removed, capped.")


class SliceLogsSerializer(serializers.Serializer):
    slice = serializers.IntegerField()
    lines = SliceLogLineSerializer(many=True)
    next_cursor = serializers.IntegerField(help_text="Pass as `after` for the lines after.")
    more = serializers.BooleanField(help_text="More lines are kept after these.")
    following = serializers.BooleanField(
        help_text="The slice still runs: new lines will come (ask again in a few seconds)."
    )
