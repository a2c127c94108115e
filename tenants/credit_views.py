"""Pages for credit: a tenant asks ops for credit, ops grant or decline it and set what a
credit is worth. Every write is one service call; the pages only show and redirect."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from gpuplatform.errors import ServiceError

from . import selectors, services
from .forms import CreditDecisionForm, CreditRateForm, CreditRequestForm
from .models import CreditRequest
from .money import credits_text
from .views import member_required


def _first_error(form) -> str:  # type: ignore[no-untyped-def]
    for name, errors in form.errors.items():
        label = form.fields[name].label if name in form.fields else ""
        return f"{label}: {errors[0]}" if label else errors[0]
    return "Check the form."


@member_required
@require_POST
def credit_request_create(request: HttpRequest) -> HttpResponse:
    form = CreditRequestForm(request.POST)
    if not form.is_valid():
        messages.error(request, _first_error(form))
        return redirect(reverse("tenants:dashboard") + "#credit")
    try:
        asked = services.credit_request_create(
            membership=request.membership,
            amount=form.cleaned_data["amount"],
            note=form.cleaned_data["note"],
        )
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request, f"Asked ops for {credits_text(asked.amount)}: you will get an email."
        )
    return redirect(reverse("tenants:dashboard") + "#credit")


@member_required
@require_POST
def credit_request_withdraw(request: HttpRequest, pk: int) -> HttpResponse:
    asked = get_object_or_404(
        selectors.credit_request_list(tenant=request.membership.tenant), pk=pk
    )
    try:
        services.credit_request_withdraw(membership=request.membership, request=asked)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Request withdrawn.")
    return redirect(reverse("tenants:dashboard") + "#credit")


@staff_member_required
@require_POST
def ops_credit_request_decide(request: HttpRequest, pk: int, decision: str) -> HttpResponse:
    asked = get_object_or_404(CreditRequest.objects.select_related("tenant"), pk=pk)
    form = CreditDecisionForm(request.POST)
    back = reverse("tenants:ops_credit") + "#credit-requests"
    if not form.is_valid():
        messages.error(request, _first_error(form))
        return redirect(back)
    note = form.cleaned_data["note"]
    try:
        if decision == "grant":
            services.credit_request_grant(request=asked, actor=request.user, note=note)
            messages.success(
                request, f"{credits_text(asked.amount)} granted to {asked.tenant.name}."
            )
        else:
            services.credit_request_decline(request=asked, actor=request.user, note=note)
            messages.success(request, f"{asked.tenant.name}'s request declined.")
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect(back)


@staff_member_required
@require_POST
def ops_credit_rate(request: HttpRequest) -> HttpResponse:
    form = CreditRateForm(request.POST)
    back = reverse("tenants:ops_credit") + "#credit-rate"
    if not form.is_valid():
        messages.error(request, _first_error(form))
        return redirect(back)
    try:
        rate = services.credit_rate_set(actor=request.user, **form.cleaned_data)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"From now on {rate}.")
    return redirect(back)
