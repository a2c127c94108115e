"""Serializers of the usage export: its rows and its totals (output only)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from tenants.exports import SECTIONS


def _money(**kw: Any) -> serializers.DecimalField:
    return serializers.DecimalField(max_digits=14, decimal_places=2, **kw)


class UsageLineSerializer(serializers.Serializer):
    section = serializers.ChoiceField(choices=SECTIONS)
    ref = serializers.IntegerField(
        allow_null=True,
        help_text="The slice's, volume's or ledger entry's id (by section; a volume whose "
        "storage entry cannot be matched to one: null).",
    )
    at = serializers.DateTimeField(
        allow_null=True, help_text="When: the ledger entry, or the last metered time."
    )
    description = serializers.CharField(
        help_text="The slice's image, the volume's storage memo or the ledger memo."
    )
    tier = serializers.CharField(help_text="The tier of the purchase, where there is one.")
    purchase = serializers.IntegerField(allow_null=True)
    started = serializers.DateTimeField(
        allow_null=True, help_text="Slices: the first metered minute in the range."
    )
    stopped = serializers.DateTimeField(
        allow_null=True, help_text="Slices: when it stopped, if it did within the range."
    )
    minutes = serializers.IntegerField(
        allow_null=True,
        help_text="Slices: minutes metered; purchases: minutes bought; refunds: returned.",
    )
    gb_hours = serializers.DecimalField(max_digits=20, decimal_places=4, allow_null=True)
    cost = _money(
        allow_null=True,
        help_text="Slices: the purchase price's share for these minutes; volumes: storage.",
    )
    ledger_amount = _money(
        allow_null=True, help_text="Credit the ledger moved (negative: taken); slices: null."
    )
    interruptible = serializers.BooleanField(
        allow_null=True,
        help_text="Paid from an interruptible purchase (preemptible, at the tier's discount); "
        "null for rows without a purchase.",
    )


class UsageSummarySerializer(serializers.Serializer):
    first = serializers.DateField()
    last = serializers.DateField()
    opening_balance = _money()
    grants = _money()
    adjustments = _money()
    purchases = _money()
    refunds = _money()
    storage = _money()
    ledger_net = _money()
    closing_balance = _money()
    opening_prepaid = _money()
    slices = _money()
    closing_prepaid = _money()
    volumes = _money()
    slice_minutes = serializers.IntegerField()
    gb_hours = serializers.DecimalField(max_digits=20, decimal_places=4)


class UsageExportPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = UsageLineSerializer(many=True)
    summary = UsageSummarySerializer()
