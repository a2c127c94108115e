"""Forms for the slice lifecycle pages (buy, launch, ops). They turn page fields into the
shapes services take; services enforce the rules and their messages reach the form."""

import secrets
from decimal import Decimal

from django import forms

from gpuplatform.errors import ServiceError
from gpuplatform.querystring import is_id
from nodes.models import Node

from . import services
from .fit import JobForm
from .models import Image, Purchase, Slice, Tenant, Tier
from .money import Rate
from .selectors import image_list, purchase_list, tier_list


def new_form_token() -> str:
    """The per-form Idempotency-Key: a double submit of one rendered form acts once."""
    return secrets.token_urlsafe(24)


class TokenField(forms.CharField):
    def __init__(self, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(max_length=128, widget=forms.HiddenInput, **kwargs)


class TierChoiceField(forms.ModelChoiceField):
    rate: Rate = Rate()

    def label_from_instance(self, obj: Tier) -> str:
        money = self.rate.format_value(obj.price_per_hour)
        return f"{obj.name} VRAM · {money} / hour ({obj.price_per_hour} credits)"


class BuyForm(forms.Form):
    tier = TierChoiceField(queryset=Tier.objects.none(), empty_label=None)
    hours = forms.IntegerField(min_value=1, max_value=services.MAX_PURCHASE_HOURS, initial=1)
    idempotency_token = TokenField()

    def __init__(self, *args, rate: Rate, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fields["tier"].queryset = tier_list()
        self.fields["tier"].rate = rate
        self.fields["idempotency_token"].initial = new_form_token()

    def total(self) -> Decimal | None:
        data = getattr(self, "cleaned_data", {})
        if not data.get("tier") or not data.get("hours"):
            return None
        return (data["tier"].price_per_hour * data["hours"]).quantize(Decimal("0.01"))


class PurchaseChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Purchase) -> str:
        return f"#{obj.pk} · {obj.tier.name} · {obj.minutes_left} of {obj.minutes_total} min left"


def open_purchases(tenant: Tenant | None):  # type: ignore[no-untyped-def]
    """Purchases with minutes left, not refunded: a launch may use one with no live slice."""
    return purchase_list(tenant=tenant).filter(minutes_left__gt=0, refunded_at__isnull=True)


def usable_purchases(tenant: Tenant | None):  # type: ignore[no-untyped-def]
    """Purchases a launch may use: minutes left, not refunded, no live slice on them."""
    return open_purchases(tenant).filter(live_slices=0)


def slices_holding_purchases(tenant: Tenant | None) -> list[Slice]:
    """The live slices (requested to stopping) on open purchases: each purchase runs one
    slice at a time, so these are what keep an otherwise usable purchase from a launch."""
    busy = [p.pk for p in open_purchases(tenant).filter(live_slices__gt=0)]
    if not busy:
        return []
    return list(
        Slice.objects.for_tenant(tenant)
        .filter(purchase_id__in=busy, state__in=Slice.LIVE_STATES)
        .select_related("purchase__tier")
        .order_by("-created_at", "-id")
    )


def lines(text: str) -> list[str]:
    return [line.rstrip("\r") for line in (text or "").split("\n")]


class LaunchForm(JobForm):
    field_order = ["purchase", "image"]  # then the job, then how to run it

    purchase = PurchaseChoiceField(queryset=Purchase.objects.none(), empty_label=None)
    image = forms.ModelChoiceField(queryset=Image.objects.none(), empty_label=None)
    model = forms.ChoiceField(label="Model")
    command = forms.CharField(
        required=False,
        max_length=64 * 1024,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "python\nserve.py\n--port\n8000"}),
        help_text="One argument per line, run without a shell. Empty: the image's default.",
    )
    environment = forms.CharField(
        required=False,
        max_length=256 * 1024,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "HF_HOME=/data/hf"}),
        help_text="NAME=value, one per line; the value is everything after the first '='.",
    )
    ssh_public_key = forms.CharField(
        label="SSH public key",
        required=False,
        max_length=9000,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "ssh-ed25519 AAAA… you@laptop"}),
        help_text="Required for images you reach over SSH.",
    )
    guaranteed = forms.BooleanField(
        label="Guaranteed VRAM (never on an overcommitted GPU)",
        required=False,
        initial=True,
        help_text="Uncheck to allow a GPU whose slices are sold above its physical VRAM "
        "(ops set this only from measured peaks): placement may come sooner, but a "
        "neighbour's peak can squeeze yours. Keep it for online inference.",
    )
    idempotency_token = TokenField()

    def __init__(self, *args, tenant: Tenant | None = None, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        # Any own purchase validates, so a used one gets the service's reason (and a double
        # submit its first slice); only usable ones are offered.
        self.fields["purchase"].queryset = Purchase.objects.for_tenant(tenant).select_related(
            "tier"
        )
        self.usable = list(usable_purchases(tenant))
        field = self.fields["purchase"]
        field.widget.choices = [(p.pk, field.label_from_instance(p)) for p in self.usable]
        self.fields["image"].queryset = image_list(active_only=True)
        self.fields["idempotency_token"].initial = new_form_token()

    def clean_command(self) -> list[str]:
        argv = [item for item in lines(self.cleaned_data.get("command", "")) if item.strip()]
        try:
            return services.clean_command(argv)
        except ServiceError as exc:
            raise forms.ValidationError(exc.message) from exc

    def clean_environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for number, line in enumerate(lines(self.cleaned_data.get("environment", "")), 1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"Line {number}: write NAME=value.")
            name = name.strip()
            if name in env:
                raise forms.ValidationError(f"{name} is set twice.")
            env[name] = value
        try:
            return services.clean_environment(env)
        except ServiceError as exc:
            raise forms.ValidationError(exc.message) from exc

    def model_request(self) -> dict:
        """The estimator input without the tier: the purchase supplies it."""
        return self.job_mapping({"catalog": self.cleaned_data["model"]})


class LaunchEstimateForm(JobForm):
    """The launch page's live estimate: the job's fields, against the chosen purchase's
    tier (any own purchase; none: no tier, only the smallest that fits)."""

    model = forms.ChoiceField(label="Model")

    def __init__(self, *args, tenant: Tenant | None = None, tiers=(), **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.tiers = list(tiers)
        wanted = str(self.data.get("purchase", ""))
        self.purchase = (
            Purchase.objects.for_tenant(tenant).select_related("tier").filter(pk=wanted).first()
            if is_id(wanted)
            else None
        )

    def to_mapping(self) -> dict:
        mapping = self.job_mapping({"catalog": self.cleaned_data["model"]})
        if self.tiers:
            mapping["tiers_mib"] = [t.vram_mb for t in self.tiers]
        if self.purchase is not None:
            mapping["tier_mib"] = self.purchase.tier.vram_mb
        return mapping


class StopForm(forms.Form):
    """The confirmation step of a stop: only the confirm page posts `confirm`."""

    confirm = forms.BooleanField()


# --- ops -------------------------------------------------------------------------------------


class TenantChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Tenant) -> str:
        return f"{obj.name} ({obj.slug}) · {obj.credit_balance} credits"


class SliceFilterForm(forms.Form):
    """Ops slice filters; an unknown value means no filter rather than an error page."""

    state = forms.ChoiceField(choices=[("", "any state"), *Slice.State.choices], required=False)
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.order_by("name"), required=False, empty_label="any tenant"
    )
    node = forms.ModelChoiceField(
        queryset=Node.objects.order_by("name"), required=False, empty_label="any node"
    )
    image = forms.ModelChoiceField(
        queryset=Image.objects.order_by("name"), required=False, empty_label="any image"
    )


class ForceStopForm(forms.Form):
    reason = forms.CharField(
        max_length=300, help_text="Recorded on the slice and shown to the tenant."
    )
    confirm = forms.BooleanField(widget=forms.HiddenInput, initial=True)


class CreditGrantForm(forms.Form):
    tenant = TenantChoiceField(queryset=Tenant.objects.none(), empty_label="choose a tenant")
    amount = forms.DecimalField(
        label="Credits", max_digits=12, decimal_places=2, min_value=Decimal("0.01")
    )
    memo = forms.CharField(max_length=200, help_text="What the grant is for (the tenant sees it).")
    idempotency_token = TokenField(required=False)

    def __init__(self, *args, tenants=None, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fields["idempotency_token"].initial = new_form_token()  # a double click: once
        self.fields["tenant"].queryset = (
            tenants if tenants is not None else Tenant.objects.order_by("name")
        )


class RefundForm(forms.Form):
    memo = forms.CharField(max_length=200, required=False)
    confirm = forms.BooleanField(widget=forms.HiddenInput, initial=True)


class ImageForm(forms.Form):
    name = forms.CharField(max_length=64)
    reference = forms.CharField(max_length=255, help_text="e.g. pytorch/pytorch:2.4.0-runtime")
    digest = forms.CharField(
        max_length=71, required=False, help_text="Optional sha256:… to pin the exact image."
    )
    description = forms.CharField(max_length=300, required=False)
    default_command = forms.CharField(
        label="Default command",
        required=False,
        max_length=64 * 1024,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One argument per line.",
    )
    ports = forms.CharField(
        label="Exposed ports",
        required=False,
        max_length=100,
        help_text="Comma-separated, e.g. 22 for SSH, 8888 for Jupyter.",
    )
    connect = forms.ChoiceField(label="Tenants connect by", choices=Image.Connect.choices)
    is_active = forms.BooleanField(label="Allowed", required=False, initial=True)

    def clean_default_command(self) -> list[str]:
        return [i for i in lines(self.cleaned_data.get("default_command", "")) if i.strip()]

    def clean_ports(self) -> list[int]:
        raw = self.cleaned_data.get("ports", "").replace(",", " ").split()
        try:
            return [int(p) for p in raw]
        except ValueError as exc:
            raise forms.ValidationError("Ports are whole numbers, e.g. 22, 8888.") from exc

    @classmethod
    def initial_for(cls, image: Image) -> dict:
        return {
            "name": image.name,
            "reference": image.reference,
            "digest": image.digest,
            "description": image.description,
            "default_command": "\n".join(image.default_command or []),
            "ports": ", ".join(str(p) for p in image.ports or []),
            "connect": image.connect,
            "is_active": image.is_active,
        }
