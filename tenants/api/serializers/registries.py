"""Serializers of the registry API: ops' registry rules (and their changes), and a
tenant's registry logins, whose user name and password are written only: no serializer
here has a field that reads them back."""

from __future__ import annotations

from rest_framework import serializers

from gpuplatform.api.serializers import StrictSerializer
from tenants.image_policy import MODE_WORDS, MODES
from tenants.models import RegistryCredential, RegistryRule

MODE_CHOICES = [(m, MODE_WORDS[m]) for m in MODES]


class RegistryRuleSerializer(serializers.ModelSerializer):
    updated_by = serializers.CharField(
        source="updated_by.username", read_only=True, default=None, allow_null=True
    )

    class Meta:
        model = RegistryRule
        fields = ["id", "pattern", "mode", "note", "created_at", "updated_at", "updated_by"]
        read_only_fields = fields


class RegistryRuleWriteSerializer(StrictSerializer):
    pattern = serializers.CharField(
        max_length=255,
        help_text="*, a registry (ghcr.io), a path under one (ghcr.io/acme/*) or one "
        "repository (docker.io/library/python). The same pattern again changes its rule.",
    )
    mode = serializers.ChoiceField(
        choices=MODE_CHOICES,
        help_text="allowlist: only allowlisted images; registry: any image from here; any: "
        "any image from here, on nodes whose node agent runs only.",
    )
    reason = serializers.CharField(max_length=500, help_text="Why: kept in the history.")


class RegistryRuleChangeSerializer(StrictSerializer):
    mode = serializers.ChoiceField(choices=MODE_CHOICES)
    reason = serializers.CharField(max_length=500, help_text="Why: kept in the history.")


class RegistryRuleRemoveSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=500, help_text="Why: kept in the history.")


class RegistryCredentialSerializer(serializers.ModelSerializer):
    """A registry login as it is shown: where, by whom, when. Never what."""

    created_by = serializers.CharField(
        source="created_by.email", read_only=True, default=None, allow_null=True
    )

    class Meta:
        model = RegistryCredential
        fields = ["id", "registry", "created_by", "created_at", "updated_at", "last_used_at"]
        read_only_fields = fields


class RegistryCredentialWriteSerializer(StrictSerializer):
    registry = serializers.CharField(
        max_length=255, help_text="Host or host:port: ghcr.io, docker.io, 127.0.0.1:5000."
    )
    username = serializers.CharField(max_length=255, write_only=True)
    password = serializers.CharField(
        max_length=4096,
        write_only=True,
        trim_whitespace=False,
        help_text="A password or (better) a read-only access token: sealed at once, never "
        "shown again. Saving a registry again replaces its login.",
    )
