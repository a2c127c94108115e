"""Launch templates: what tenants read (with the engine flags a slice of each tier gets on
each card in service) and what ops write."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuplatform.api.serializers import StrictSerializer
from nodes.selectors import gpu_shapes_in_service
from tenants import selectors
from tenants.models import Image, LaunchTemplate, Tier


class EngineSizingSerializer(serializers.Serializer):
    tier_mb = serializers.IntegerField(help_text="The tier's VRAM (MiB).")
    budget_mb = serializers.IntegerField(help_text="What the estimate lets the engine take.")
    device = serializers.CharField(help_text="The card, or the quota library's view of it.")
    reported_total_mb = serializers.IntegerField(help_text="The total CUDA reports there.")
    args = serializers.ListField(child=serializers.CharField(), help_text="Appended at start.")


class TemplateSerializer(serializers.ModelSerializer):
    model = serializers.JSONField(source="model_request", help_text="The job, for the estimate.")
    image_name = serializers.CharField(source="image.name", read_only=True)
    sizing = serializers.SerializerMethodField(
        help_text="Per tier and card in service: the engine flag a slice launched from this "
        "template gets at start (empty for an engine told by variable or none)."
    )

    class Meta:
        model = LaunchTemplate
        fields = [
            "id",
            "name",
            "description",
            "image",
            "image_name",
            "engine",
            "command",
            "environment",
            "model",
            "sizing",
        ]
        read_only_fields = fields

    @extend_schema_field(EngineSizingSerializer(many=True))
    def get_sizing(self, template: LaunchTemplate) -> list[dict]:
        tiers, shapes = self._sizing_inputs()
        return selectors.template_sizing(template, tiers=tiers, shapes=shapes)

    def _sizing_inputs(self) -> tuple[list[Tier], list[dict[str, Any]]]:
        """The tiers and the card shapes in service, read once per answer: a list's rows
        share its context, so a page of templates costs two queries, not two a row."""
        # the root serializer's own dict (DRF types the context as a read-only mapping)
        context = cast(dict[str, Any], self.context)
        if "sizing_inputs" not in context:
            context["sizing_inputs"] = (list(selectors.tier_list()), gpu_shapes_in_service())
        inputs: tuple[list[Tier], list[dict[str, Any]]] = context["sizing_inputs"]
        return inputs


class OpsTemplateSerializer(TemplateSerializer):
    class Meta(TemplateSerializer.Meta):
        fields = [*TemplateSerializer.Meta.fields, "is_active", "created_at", "updated_at"]
        read_only_fields = fields


class TemplateWriteSerializer(StrictSerializer):
    name = serializers.CharField(max_length=64)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)
    image = serializers.PrimaryKeyRelatedField(queryset=Image.objects.filter(is_active=True))
    engine = serializers.ChoiceField(
        choices=LaunchTemplate.Engine.choices, required=False, allow_blank=True
    )
    command = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True), required=False
    )
    environment = serializers.DictField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True), required=False
    )
    model = serializers.JSONField(required=False, help_text="The job, for the estimate.")
    is_active = serializers.BooleanField(required=False)

    def to_service(self) -> dict:
        data = dict(self.validated_data)
        if "model" in data:
            data["model_request"] = data.pop("model")
        return data
