"""Serializers of the accounts API: tenants, me, API tokens, SSH keys, members."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from rest_framework import serializers

from gpuplatform.api.scopes import MAX_NETWORKS, SCOPES
from gpuplatform.api.serializers import StrictModelSerializer, StrictSerializer
from tenants.models import ApiToken, Membership, SshKey, Tenant
from tenants.services.accounts import API_TOKEN_MAX_DAYS
from tenants.services.keys import SSH_KEY_NAME_MAX
from tenants.ssh_keys import SSH_PUBLIC_KEY_MAX_CHARS


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "status", "credit_balance", "created_at"]
        read_only_fields = fields


class MeSerializer(serializers.ModelSerializer):
    tenant = serializers.SerializerMethodField()
    role = serializers.SerializerMethodField()

    class Meta:
        model = get_user_model()
        fields = ["id", "email", "is_staff", "tenant", "role"]
        read_only_fields = fields

    def _membership(self) -> Membership | None:
        membership: Membership | None = self.context.get("membership")
        return membership

    def get_tenant(self, user: User) -> dict | None:
        m = self._membership()
        return TenantSerializer(m.tenant).data if m else None

    def get_role(self, user: User) -> str | None:
        m = self._membership()
        return m.role if m else None


class ApiTokenSerializer(serializers.ModelSerializer):
    is_live = serializers.BooleanField(read_only=True)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=SCOPES),
        read_only=True,
        help_text="What the token may do; at each use also bounded by your role then.",
    )
    allowed_networks = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="CIDR networks the token may be used from; empty: anywhere.",
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "created_at",
            "expires_at",
            "scopes",
            "allowed_networks",
            "last_used_at",
            "last_used_address",
            "revoked_at",
            "is_live",
        ]
        read_only_fields = fields


class ApiTokenCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=64, trim_whitespace=True)
    expires_in_days = serializers.IntegerField(
        min_value=1,
        max_value=API_TOKEN_MAX_DAYS,
        required=False,
        allow_null=True,
        help_text="Leave empty for a token that does not expire.",
    )
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=SCOPES),
        required=False,
        allow_empty=False,
        max_length=len(SCOPES),
        help_text="read: every GET; launch: slices and volumes; billing: purchases and "
        "credit requests; admin: tokens, SSH keys, spend limits, webhooks, ops endpoints. "
        "Omitted: every scope your role allows.",
    )
    allowed_networks = serializers.ListField(
        child=serializers.CharField(max_length=43, trim_whitespace=True),
        required=False,
        max_length=MAX_NETWORKS,
        help_text="CIDR networks (`203.0.113.0/24`, `2001:db8::/32`) the token may be used "
        "from; any other address gets 403 `ip_not_allowed`. Omitted or empty: anywhere.",
    )


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once: store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class SshKeySerializer(serializers.ModelSerializer):
    type = serializers.CharField(source="key_type", read_only=True)

    class Meta:
        model = SshKey
        fields = [
            "id",
            "name",
            "type",
            "fingerprint",
            "public_key",
            "comment",
            "created_at",
            "last_used_at",
            "last_used_address",
        ]
        read_only_fields = fields


class SshKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(
        max_length=SSH_KEY_NAME_MAX, trim_whitespace=True, help_text="e.g. laptop"
    )
    public_key = serializers.CharField(
        max_length=SSH_PUBLIC_KEY_MAX_CHARS,
        trim_whitespace=True,
        help_text="One OpenSSH public key line, the contents of your .pub file: "
        "`ssh-ed25519 AAAA… you@laptop`. Accepted: ssh-ed25519, ecdsa-sha2-nistp256/384/521, "
        "ssh-rsa of at least 2048 bits, sk-ssh-ed25519@openssh.com, "
        "sk-ecdsa-sha2-nistp256@openssh.com. The comment is kept apart.",
    )


class MemberSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "email", "role", "created_at"]
        read_only_fields = fields


class OpsTenantSerializer(TenantSerializer):
    member_count = serializers.IntegerField(read_only=True)

    class Meta(TenantSerializer.Meta):
        fields = [*TenantSerializer.Meta.fields, "status_reason", "member_count"]
        read_only_fields = fields


class TenantStatusSerializer(StrictModelSerializer):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    class Meta:
        model = Tenant
        fields = ["status", "reason"]
        # required: the model's default would otherwise make it optional here
        extra_kwargs = {"status": {"required": True}}
