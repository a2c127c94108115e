"""The public "will it fit?" page, and what the fit and launch pages show of an estimate
(`present`): whole-MiB figures by the one rounding rule (`estimator.whole_mib`), tiers by
name, and suggestions the form can apply."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

import estimator
from gpuplatform.http import PageRequest
from gpuplatform.pages import is_partial

from ..forms.estimate import (
    DEFAULT_MODEL,
    FORM_FIELD_FOR,
    FitForm,
    add_estimator_error,
    error_summary,
)
from ..hub import hub_reader
from ..models import Tier


def _fit_result(form: FitForm, request: PageRequest) -> dict[str, Any]:
    """The verdict for a valid form, or only its errors: a bad value clears the verdict."""
    if not form.is_valid():
        return {"error": error_summary(form)}
    context = estimate_for(form, form.to_mapping(), tiers=form.tiers, request=request)
    if "shown" in context:
        context["chart"] = chart_data(context["shown"])
    return context


@require_GET
def fit(request: PageRequest) -> HttpResponse:
    """Public: will a model fit a tier? The breakdown updates live as fields change."""
    form = FitForm(request.GET or None)
    context: dict[str, Any] = {"form": form}
    if request.GET:
        context.update(_fit_result(form, request))
    else:
        # The form's own initial values (weights as the checkpoint stores them, ...).
        initial = {n: f.initial for n, f in FitForm.base_fields.items() if f.initial is not None}
        bound = FitForm(
            {**initial, "model": DEFAULT_MODEL, "tier_mib": form.fields["tier_mib"].initial or ""}
        )
        context.update(_fit_result(bound, request))
        context["form"] = bound
    partial = is_partial(request)
    context.update(
        partial=partial,  # the partial also rewrites the fields' error slots (out of band)
        error_fields=context["form"].visible_fields(),
        form_error_id="fit-form-error",
    )
    template = "tenants/_fit_result.html" if partial else "tenants/fit.html"
    return render(request, template, context)


def apply_values(changes: dict[str, Any], form: forms.Form) -> str | None:
    """The form values that apply a suggestion, as JSON for the page's apply button
    (field name -> value; true/false for a checkbox), or None when one of its changes
    has no field on this form."""
    values: dict[str, object] = {}
    for key, value in changes.items():
        name = FORM_FIELD_FOR.get(key, key)
        if name not in form.fields:
            return None
        values[name] = value if isinstance(value, bool) else str(value)
    return json.dumps(values, sort_keys=True)


def present(
    data: dict[str, Any], *, tiers: list[Tier], form: forms.Form | None = None
) -> dict[str, Any]:
    """What a page shows of an estimate's dict.

    - every MiB figure by one rule: `estimator.whole_mib` (rounded up) for the totals,
      and terms in whole MiB that add up to that total (`estimator.whole_terms`);
    - tiers by name, from the Tier rows: the chosen one, the smallest that fits, and a
      cheaper one that fits when the chosen tier is not the cheapest that would;
    - each suggestion with the form values that apply it (none without a form: a
      refused slice's page shows what would have fitted, with nothing to apply it to).
    """
    by_mib: dict[int | None, Tier] = {t.vram_mb: t for t in tiers}  # None: no tier named
    terms = data.get("terms") or []
    wholes = estimator.whole_terms([t["mib"] for t in terms], data["total_mib"])
    smallest_mib = data.get("smallest_fitting_tier_mib")
    fitting = [t for t in tiers if smallest_mib is not None and t.vram_mb >= smallest_mib]
    smallest = by_mib.get(smallest_mib) or (fitting[0] if fitting else None)
    chosen = by_mib.get(data.get("tier_mib"))
    cheaper = None
    if chosen is not None and data.get("fits") and fitting:
        cheapest = min(fitting, key=lambda t: (t.price_per_hour, t.vram_mb))
        if cheapest.price_per_hour < chosen.price_per_hour:
            cheaper = cheapest
    tier_mib = data.get("tier_mib")
    return {
        "fits": data.get("fits"),
        "total_mib": data["total_mib"],
        "usable_mib": data.get("usable_mib"),
        "tier": chosen,
        "tier_name": chosen.name if chosen else (f"{tier_mib} MiB" if tier_mib else ""),
        "smallest_tier": smallest,
        "no_tier_fits": smallest_mib is None,
        "cheaper_tier": cheaper,
        "terms": [{**term, "whole_mib": whole} for term, whole in zip(terms, wholes, strict=True)],
        "suggestions": [
            {
                **s,
                "apply": apply_values(s.get("changes") or {}, form)
                if s.get("fits") and form is not None
                else None,
            }
            for s in data.get("suggestions") or []
        ],
        "notes": data.get("notes") or [],
    }


def chart_data(shown: dict[str, Any]) -> dict[str, Any]:
    """The fit page's stacked bar: the same whole-MiB terms the table shows."""
    return {
        "labels": [t["label"] for t in shown["terms"]],
        "mib": [t["whole_mib"] for t in shown["terms"]],
        "tier_mib": shown["tier"].vram_mb if shown["tier"] else None,
        "usable_mib": estimator.whole_mib(shown["usable_mib"]),
    }


def estimate_for(
    form: forms.Form, mapping: dict[str, Any], *, tiers: list[Tier], request: PageRequest
) -> dict[str, Any]:
    """Estimate a valid form's job: {"result", "shown"}, or {"error"} with the estimator's
    refusal on the field it names (the previous verdict is never kept)."""
    try:
        result = estimator.estimate(
            estimator.EstimateRequest.from_mapping(mapping, hub=hub_reader(request))
        )
    except estimator.EstimatorError as exc:
        add_estimator_error(form, exc)
        return {"error": error_summary(form)}
    data = result.to_dict()
    return {"result": data, "shown": present(data, tiers=tiers, form=form)}
