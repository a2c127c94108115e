"""Forms of the money pages: buying hours, credit requests and decisions, the credit rate,
ops' grants and refunds. Services enforce the rules; their messages reach the form."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.db.models import QuerySet

from gpuplatform.pages import form_field

from ..models import Tenant, Tier
from ..money import Rate
from ..selectors import tier_list
from ..services.billing import MAX_PURCHASE_HOURS
from .fields import TokenField, new_form_token


class CreditRequestForm(forms.Form):
    amount = forms.DecimalField(
        label="Credits", min_value=Decimal("0.01"), max_digits=12, decimal_places=2
    )
    note = forms.CharField(
        label="Note for ops",
        max_length=500,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="What the credit is for (optional).",
    )


class CreditDecisionForm(forms.Form):
    note = forms.CharField(
        label="Note to the tenant",
        max_length=500,
        required=False,
        help_text="Required to decline: the tenant reads it.",
    )


class CreditRateForm(forms.Form):
    currency = forms.CharField(label="Currency (ISO 4217)", min_length=3, max_length=3)
    per_credit = forms.DecimalField(
        label="One credit is worth", max_digits=12, decimal_places=4, min_value=Decimal("0.0001")
    )
    reason = forms.CharField(label="Why", max_length=300)


class TierChoiceField(forms.ModelChoiceField):
    rate: Rate = Rate()

    def label_from_instance(self, obj: Tier) -> str:
        money = self.rate.format_value(obj.price_per_hour)
        return f"{obj.name} VRAM · {money} / hour ({obj.price_per_hour} credits)"


class BuyForm(forms.Form):
    tier = TierChoiceField(queryset=Tier.objects.none(), empty_label=None)
    hours = forms.IntegerField(min_value=1, max_value=MAX_PURCHASE_HOURS, initial=1)
    interruptible = forms.BooleanField(
        label="Interruptible, at the tier's discount",
        required=False,
        help_text="Its slices run on spare GPU room and are preempted when a full-price "
        "launch needs it or the card runs short: given notice first (SIGTERM, a webhook, the "
        "slice's timeline), billed to the stop, volumes kept, resumable; the unused minutes "
        "stay on the purchase. Inference only, not training.",
    )
    idempotency_token = TokenField()

    def __init__(self, *args: Any, rate: Rate, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tier = form_field(self, "tier", TierChoiceField)
        tier.queryset = tier_list()
        tier.rate = rate
        self.fields["idempotency_token"].initial = new_form_token()

    def total(self) -> Decimal | None:
        data = getattr(self, "cleaned_data", {})
        if not data.get("tier") or not data.get("hours"):
            return None
        return data["tier"].price_of(data["hours"], interruptible=bool(data.get("interruptible")))


class TenantChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Tenant) -> str:
        return f"{obj.name} ({obj.slug}) · {obj.credit_balance} credits"


class CreditGrantForm(forms.Form):
    tenant = TenantChoiceField(queryset=Tenant.objects.none(), empty_label="choose a tenant")
    amount = forms.DecimalField(
        label="Credits", max_digits=12, decimal_places=2, min_value=Decimal("0.01")
    )
    memo = forms.CharField(max_length=200, help_text="What the grant is for (the tenant sees it).")
    idempotency_token = TokenField(required=False)

    def __init__(self, *args: Any, tenants: QuerySet[Tenant] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["idempotency_token"].initial = new_form_token()  # a double click: once
        form_field(self, "tenant", TenantChoiceField).queryset = (
            tenants if tenants is not None else Tenant.objects.order_by("name")
        )


class RefundForm(forms.Form):
    memo = forms.CharField(max_length=200, required=False)
    confirm = forms.BooleanField(widget=forms.HiddenInput, initial=True)
