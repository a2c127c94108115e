"""Forms of the incident pages: ledger filters, the actions' confirmations, the KPI
period and the watchdog thresholds. Services enforce the rules; these shape the input."""

from __future__ import annotations

from typing import Any

from django import forms

from gpuplatform.datetimes import UtcDateTimeField
from gpuplatform.querystring import is_id
from tenants.models import Tenant

from . import kpis
from .models import Incident, Thresholds
from .rules import RULES
from .selectors import SORTS, IncidentFilters

DATETIME_WIDGET = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class IncidentFilterForm(forms.Form):
    """Ledger filters. A field with a bad value is dropped (and shown as an error); the
    others still filter."""

    status = forms.ChoiceField(
        choices=[("", "any status"), ("unresolved", "unresolved"), *Incident.Status.choices],
        required=False,
    )
    severity = forms.ChoiceField(
        choices=[("", "any severity"), *Incident.Severity.choices], required=False
    )
    root_cause = forms.ChoiceField(
        label="Class", choices=[("", "any class"), *Incident.RootCause.choices], required=False
    )
    # the rules the code files, not a scan of the ledger for the ones it holds
    rule = forms.ChoiceField(
        choices=[("", "any rule"), *((rule, rule) for rule in RULES)], required=False
    )
    # Typed, not picked: a list of every node and tenant would grow the page with the
    # fleet (1,000 nodes made it twice as long as the ledger's rows).
    node = forms.CharField(label="Node", max_length=64, required=False, help_text="its name")
    gpu = forms.CharField(label="GPU UUID", max_length=96, required=False)
    tenant = forms.CharField(
        label="Tenant", max_length=200, required=False, help_text="its name or id"
    )
    since = UtcDateTimeField(label="Seen since", required=False, widget=DATETIME_WIDGET)
    until = UtcDateTimeField(label="First seen until", required=False, widget=DATETIME_WIDGET)
    q = forms.CharField(label="Search", max_length=100, required=False)
    sort = forms.ChoiceField(
        choices=[
            ("last_seen", "last seen"),
            ("first_seen", "first seen"),
            ("severity", "severity"),
            ("occurrences", "occurrences"),
        ],
        required=False,
    )

    def selector_args(self) -> IncidentFilters:
        """The valid filters, as selectors.incident_list takes them."""
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        q = (data.get("q") or "").replace("\x00", "").strip()
        sort = data.get("sort") or "last_seen"
        return {
            "status": data.get("status") or "",
            "severity": data.get("severity") or "",
            "root_cause": data.get("root_cause") or "",
            "rule": data.get("rule") or "",
            "node": (data.get("node") or "").strip(),
            "gpu": (data.get("gpu") or "").strip(),
            "tenant_id": _tenant_id((data.get("tenant") or "").strip()),
            "since": data.get("since"),
            "until": data.get("until"),
            "search": q,
            "sort": sort if sort in SORTS else "last_seen",
        }


class ConfirmForm(forms.Form):
    confirm = forms.BooleanField(widget=forms.HiddenInput, initial=True)


class ResolveForm(ConfirmForm):
    note = forms.CharField(
        label="Resolution note",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="What was wrong and what fixed it (kept in the ledger).",
    )


class ReopenForm(ConfirmForm):
    note = forms.CharField(
        label="Why reopen", max_length=400, required=False, widget=forms.Textarea({"rows": 2})
    )


class ReasonForm(ConfirmForm):
    reason = forms.CharField(max_length=300, help_text="Recorded on the incident's timeline.")


class StopSliceForm(ConfirmForm):
    reason = forms.CharField(
        max_length=300, help_text="Recorded on the slice and the incident; the tenant sees it."
    )


class PeriodForm(forms.Form):
    days = forms.TypedChoiceField(
        label="Period",
        coerce=int,
        choices=[(str(d), f"last {d} days") for d in kpis.PERIODS],
        required=False,
    )

    def days_or_default(self) -> int:
        if self.is_valid() and self.cleaned_data.get("days"):
            return self.cleaned_data["days"]
        return kpis.PERIODS[0]


THRESHOLD_FIELDS = [
    f.name
    for f in Thresholds._meta.concrete_fields
    if f.name not in ("id", "updated_at", "updated_by")
]


class ThresholdsForm(forms.Form):
    """One field per threshold, with docs/domain.md's default (the model's default) beside it.
    The ordering rules are the service's: its refusal is shown on the form."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields.update(forms.fields_for_model(Thresholds, fields=THRESHOLD_FIELDS))
        defaults = {f.name: f.default for f in Thresholds._meta.concrete_fields}
        for name, field in self.fields.items():
            # the page shows each field's default beside it
            field.default_value = defaults[name]  # type: ignore[attr-defined]
            field.help_text = f"default {defaults[name]:g}"

    def changes(self) -> dict[str, Any]:
        return dict(self.cleaned_data)


def _tenant_id(text: str) -> int | None:
    """The tenant a filter names, by name (any case) or else by id; 0, which matches no
    incident, for one that names none. A name first: "1984" may be a tenant's name."""
    if not text:
        return None
    found = Tenant.objects.filter(name__iexact=text).values_list("pk", flat=True).first()
    if found is None and is_id(text):
        return int(text)
    return found or 0
