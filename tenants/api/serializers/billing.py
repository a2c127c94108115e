"""Serializers of the money API: tiers, purchases, the ledger, usage, grants and refunds,
credit requests and the credit rate.

Output serializers only read; input serializers (StrictSerializer) check shapes and types
and leave the rules (prices, limits) to the services, so the API and the pages refuse the
same things with the same words."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from gpuplatform.api.serializers import StrictSerializer
from tenants.amounts import MAX_GRANT
from tenants.models import (
    CreditRate,
    CreditRequest,
    LedgerEntry,
    Purchase,
    Tenant,
    Tier,
    UsageRecord,
)
from tenants.services.billing import MAX_PURCHASE_HOURS
from tenants.services.credit import MAX_PER_CREDIT, MIN_PER_CREDIT


class TierSerializer(serializers.ModelSerializer):
    vram_gb = serializers.IntegerField(read_only=True)
    # A string with two decimals like its sibling `price_per_hour`: money is never a float.
    interruptible_price_per_hour = serializers.DecimalField(
        max_digits=8,
        decimal_places=2,
        read_only=True,
        help_text="An interruptible hour: the price less the tier's interruptible discount.",
    )

    class Meta:
        model = Tier
        fields = [
            "id",
            "name",
            "vram_mb",
            "vram_gb",
            "cpu_cores",
            "host_ram_mb",
            "pids_limit",
            "price_per_hour",
            "interruptible_discount_pct",
            "interruptible_price_per_hour",
            "is_active",
            "description",
        ]
        read_only_fields = fields


class PurchaseSerializer(serializers.ModelSerializer):
    tier_name = serializers.CharField(source="tier.name", read_only=True)
    vram_mb = serializers.IntegerField(source="tier.vram_mb", read_only=True)
    minutes_used = serializers.IntegerField(
        read_only=True, help_text="Minutes slices ran on it (neither left nor refunded)."
    )
    live_slices = serializers.IntegerField(
        read_only=True, help_text="Slices using this purchase now (at most one)."
    )

    class Meta:
        model = Purchase
        fields = [
            "id",
            "tier",
            "tier_name",
            "vram_mb",
            "hours",
            "interruptible",
            "price_paid",
            "minutes_total",
            "minutes_left",
            "minutes_used",
            "live_slices",
            "low_warning_at",
            "refunded_at",
            "refunded_amount",
            "minutes_refunded",
            "created_at",
        ]
        read_only_fields = fields


class OpsPurchaseSerializer(PurchaseSerializer):
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)

    class Meta(PurchaseSerializer.Meta):
        fields = ["id", "tenant", "tenant_name", *PurchaseSerializer.Meta.fields[1:]]
        read_only_fields = fields


class PurchaseCreateSerializer(StrictSerializer):
    tier = serializers.PrimaryKeyRelatedField(queryset=Tier.objects.all())
    hours = serializers.IntegerField(min_value=1, max_value=MAX_PURCHASE_HOURS)
    interruptible = serializers.BooleanField(
        required=False,
        default=False,
        help_text="At the tier's interruptible discount: its slices run on overcommitted GPUs "
        "only and are preempted (stopped with notice, volumes kept) when the card runs short.",
    )


class LedgerEntrySerializer(serializers.ModelSerializer):
    by = serializers.SerializerMethodField(help_text="The member who bought, or 'ops'.")

    class Meta:
        model = LedgerEntry
        fields = ["id", "kind", "amount", "balance_after", "purchase", "memo", "by", "created_at"]
        read_only_fields = fields

    def get_by(self, entry: LedgerEntry) -> str | None:
        # Tenants see which of their members bought, never which ops person granted.
        if entry.actor is None:
            return None
        return "ops" if entry.actor.is_staff else entry.actor.email


class OpsLedgerEntrySerializer(LedgerEntrySerializer):
    class Meta(LedgerEntrySerializer.Meta):
        fields = ["id", "tenant", *LedgerEntrySerializer.Meta.fields[1:]]
        read_only_fields = fields

    def get_by(self, entry: LedgerEntry) -> str | None:
        return entry.actor.email if entry.actor is not None else None


class UsageRecordSerializer(serializers.ModelSerializer):
    interruptible = serializers.BooleanField(
        source="purchase.interruptible",
        read_only=True,
        help_text="Paid from an interruptible purchase (preemptible, at the tier's discount).",
    )

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "slice",
            "purchase",
            "minutes",
            "minutes_left_after",
            "interruptible",
            "period_start",
            "period_end",
            "at",
        ]
        read_only_fields = fields


class CreditGrantSerializer(StrictSerializer):
    tenant = serializers.PrimaryKeyRelatedField(queryset=Tenant.objects.all())
    # Generous max_digits: out of range is `min_value`/`max_value`, not a digit count.
    amount = serializers.DecimalField(
        max_digits=30,
        decimal_places=2,
        min_value=Decimal("0.01"),
        max_value=MAX_GRANT,
    )
    memo = serializers.CharField(max_length=200)


class RefundSerializer(StrictSerializer):
    memo = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class RefundResultSerializer(serializers.Serializer):
    purchase = OpsPurchaseSerializer()
    ledger_entry = OpsLedgerEntrySerializer(
        allow_null=True, help_text="Null when nothing was left to pay back."
    )


class CreditRequestSerializer(serializers.ModelSerializer):
    requested_by = serializers.SerializerMethodField()
    decided_by = serializers.SerializerMethodField()

    class Meta:
        model = CreditRequest
        fields = [
            "id",
            "amount",
            "note",
            "status",
            "requested_by",
            "created_at",
            "decided_by",
            "decided_at",
            "decision_note",
            "ledger_entry",
        ]
        read_only_fields = fields

    def get_requested_by(self, obj: CreditRequest) -> str | None:
        return obj.requested_by.email if obj.requested_by else None

    def get_decided_by(self, obj: CreditRequest) -> str | None:
        # A tenant sees that ops decided, not which operator.
        if obj.decided_by is None:
            return None
        return "ops" if obj.decided_by.is_staff else obj.decided_by.email


class OpsCreditRequestSerializer(CreditRequestSerializer):
    class Meta(CreditRequestSerializer.Meta):
        fields = ["id", "tenant", *CreditRequestSerializer.Meta.fields[1:]]
        read_only_fields = fields

    def get_decided_by(self, obj: CreditRequest) -> str | None:
        return obj.decided_by.email if obj.decided_by else None


# Generous max_digits, so an amount out of range is `min_value`/`max_value` like every other
# range error, not a digit count.
class CreditRequestCreateSerializer(StrictSerializer):
    amount = serializers.DecimalField(
        max_digits=30, decimal_places=2, min_value=Decimal("0.01"), max_value=MAX_GRANT
    )
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class CreditDecisionSerializer(StrictSerializer):
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class CreditRateSerializer(serializers.ModelSerializer):
    set_by = serializers.SerializerMethodField()

    class Meta:
        model = CreditRate
        fields = ["id", "currency", "per_credit", "reason", "set_by", "created_at"]
        read_only_fields = fields

    def get_set_by(self, obj: CreditRate) -> str | None:
        return obj.set_by.email if obj.set_by else None


class CreditRateCreateSerializer(StrictSerializer):
    currency = serializers.CharField(min_length=3, max_length=3)
    per_credit = serializers.DecimalField(
        max_digits=30, decimal_places=4, min_value=MIN_PER_CREDIT, max_value=MAX_PER_CREDIT
    )
    reason = serializers.CharField(max_length=300)


class CreditRateNowSerializer(serializers.Serializer):
    currency = serializers.CharField()
    per_credit = serializers.DecimalField(max_digits=12, decimal_places=4)
