"""Money pages: the tiers and their prices, buying hours, asking ops for credit, usage and
its CSV export, and the ops page for grants, refunds, credit requests and the credit rate."""

from __future__ import annotations

from decimal import Decimal
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.http import MemberRequest, UserRequest
from gpuplatform.pages import submit
from gpuplatform.querystring import is_id
from nodes.placement import can_host
from nodes.selectors import gpu_shapes_in_service

from .. import exports, selectors, services
from ..context_processors import request_credit_rate
from ..forms.billing import (
    BuyForm,
    CreditDecisionForm,
    CreditGrantForm,
    CreditRateForm,
    CreditRequestForm,
    RefundForm,
)
from ..models import CreditRequest, Purchase
from ..money import Rate, credits_text, money_text
from ..permissions import member_required

# The page lists this many slice and volume rows; the CSV and the API have them all.
USAGE_PAGE_ROWS = 200


@require_GET
def catalog(request: HttpRequest) -> HttpResponse:
    tiers = list(selectors.tier_list())
    shapes = gpu_shapes_in_service()
    for tier in tiers:
        models = sorted(
            {
                shape["model"] + (" (MIG)" if shape["mig_enabled"] else "")
                for shape in shapes
                if can_host(
                    tier.vram_mb,
                    total_mb=shape["total_mb"],
                    mig_enabled=shape["mig_enabled"],
                    whole_card_only=shape["whole_card_only"],
                    mig_sizes_mb=shape["mig_sizes_mb"],
                )
            }
        )
        tier.runs_on = models  # type: ignore[attr-defined]
    rate = request_credit_rate(request)
    chart = {
        "labels": [t.name for t in tiers],
        # Money per GB-hour to four places: cents would flatten the differences it shows.
        "price_per_gb_hour": [
            round(float(t.price_per_hour * rate.per_credit) / max(t.vram_gb, 1), 4) for t in tiers
        ],
        "currency": rate.currency,
    }
    return render(request, "tenants/catalog.html", {"tiers": tiers, "chart": chart})


@member_required
@require_http_methods(["GET", "POST"])
def buy(request: MemberRequest) -> HttpResponse:
    """Choose a tier and hours, confirm the total, buy once (the form's token is the key)."""
    rate = request_credit_rate(request)
    form = BuyForm(request.POST or None, initial=_buy_initial(request), rate=rate)
    if request.method == "POST" and request.POST.get("confirm") != "yes":
        # step 2: a valid form shows the total; posting it again with `confirm` buys
        confirming = form.is_valid()
        status = 200 if confirming else 400
        return _buy_page(request, form, rate, confirming=confirming, status=status)
    bought = submit(
        request,
        form,
        lambda data: services.purchase_create(
            membership=request.membership,
            tier=data["tier"],
            hours=data["hours"],
            interruptible=data["interruptible"],
            idempotency_key=data["idempotency_token"],
        ),
    )
    if bought.done:
        purchase, created = bought.result
        _say_bought(request, purchase, created=created, rate=rate)
        return redirect("tenants:dashboard")
    insufficient = bought.error is not None and bought.error.code == "insufficient_credit"
    return _buy_page(request, form, rate, insufficient=insufficient, status=bought.status)


def _say_bought(request: HttpRequest, purchase: Purchase, *, created: bool, rate: Rate) -> None:
    if created:
        messages.success(
            request,
            f"Bought {purchase.tier.name} for {purchase.hours} h"
            f"{' (interruptible)' if purchase.interruptible else ''}: "
            f"{money_text(purchase.price_paid, rate)}.",
        )
    else:
        messages.info(request, "That purchase was already made; nothing was charged.")


def _buy_page(
    request: MemberRequest,
    form: BuyForm,
    rate: Rate,
    *,
    confirming: bool = False,
    insufficient: bool = False,
    status: int,
) -> HttpResponse:
    """The buy page: the form, and once it is valid the total and the balance after it."""
    tenant = request.membership.tenant
    tiers = list(selectors.tier_list())
    total = form.total() if form.is_bound and not form.errors else None
    balance_after = tenant.credit_balance - total if total is not None else None
    return render(
        request,
        "tenants/buy.html",
        {
            "form": form,
            "tenant": tenant,
            "confirming": confirming,
            "total": total,
            "balance_after": balance_after,
            "shortfall": -balance_after
            if balance_after is not None and balance_after < 0
            else None,
            "tiers": tiers,
            # per tier: the hour's price and the interruptible discount (%), which buy.js
            # applies to the whole purchase and rounds once, as Tier.price_of does
            "prices": {
                str(t.pk): [str(t.price_per_hour), t.interruptible_discount_pct] for t in tiers
            },
            # buy.js writes the live total the way tenants.money does (same rounding, signs).
            "rate": {
                "currency": rate.currency,
                "per_credit": str(rate.per_credit),
                "symbol": rate.symbol,
                "places": rate.places,
            },
            "insufficient": insufficient,
            # the promise interruptible hours come with (tenants.services.slices.preempt)
            "preempt_notice_s": settings.SLICES_PREEMPT_NOTICE_S,
        },
        status=status,
    )


def _buy_initial(request: HttpRequest) -> dict[str, int]:
    tier = request.GET.get("tier", "")
    return {"tier": int(tier)} if is_id(tier) else {}


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_credit(request: UserRequest) -> HttpResponse:
    q = request.GET.get("q", "").replace("\x00", "").strip()[:100]
    tenants = selectors.tenant_list_for_ops(search=q)
    form = CreditGrantForm(request.POST or None, tenants=tenants if q else None)
    granted = submit(
        request,
        form,
        lambda data: services.credit_grant(
            tenant=data["tenant"],
            amount=data["amount"],
            actor=request.user,
            memo=data["memo"],
            idempotency_key=data.get("idempotency_token") or "",
        ),
    )
    if granted.done:
        entry = granted.result
        rate = request_credit_rate(request)
        messages.success(
            request,
            f"{money_text(entry.amount, rate)} granted to {entry.tenant.name}; "
            f"balance {money_text(entry.balance_after, rate)}.",
        )
        return redirect(reverse("tenants:ops_credit") + (f"?{urlencode({'q': q})}" if q else ""))
    refund_tenant = request.GET.get("tenant", "")
    purchases = selectors.purchase_list_for_ops(
        tenant_id=int(refund_tenant) if is_id(refund_tenant) else None, open_only=True
    )[:50]
    rate = request_credit_rate(request)
    return render(
        request,
        "tenants/ops_credit.html",
        {
            "form": form,
            "q": q,
            "matches": tenants.count() if q else None,
            "grants": selectors.credit_grants_recent(),
            "purchases": purchases,
            "credit_requests": list(selectors.credit_request_list_for_ops(status="pending")[:50]),
            "credit_waiting": selectors.credit_request_list_for_ops(status="pending").count(),
            "credit_decided": list(
                selectors.credit_request_list_for_ops()
                .exclude(status="pending")
                .order_by("-decided_at", "-id")[:10]
            ),
            "decision_form": CreditDecisionForm(),
            "rate_form": CreditRateForm(
                initial={"currency": rate.currency, "per_credit": rate.per_credit}
            ),
            "rate_history": list(selectors.credit_rate_history()),
        },
        status=granted.status,
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_refund(request: UserRequest, pk: int) -> HttpResponse:
    purchase = get_object_or_404(selectors.purchase_list_for_ops(), pk=pk)
    form = RefundForm(request.POST or None)
    refunded = submit(
        request,
        form,
        lambda data: services.purchase_refund(
            purchase=purchase, actor=request.user, memo=data["memo"]
        ),
        refusal="messages",
    )
    if refunded.done:
        entry = refunded.result  # None when nothing was left to pay back
        amount = entry.amount if entry is not None else Decimal("0.00")
        messages.success(
            request,
            f"Refunded {money_text(amount, request_credit_rate(request))} to "
            f"{purchase.tenant.name}.",
        )
        return redirect("tenants:ops_credit")
    return render(
        request,
        "tenants/ops_refund.html",
        {"purchase": purchase, "form": form, "amount": purchase.refund_due},
        status=refunded.status,
    )


def _first_error(form: forms.Form) -> str:
    for name, errors in form.errors.items():
        label = form.fields[name].label if name in form.fields else ""
        return f"{label}: {errors[0]}" if label else str(errors[0])  # an ErrorList reads as text
    return "Check the form."


@member_required
@require_POST
def credit_request_create(request: MemberRequest) -> HttpResponse:
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
def credit_request_withdraw(request: MemberRequest, pk: int) -> HttpResponse:
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
def ops_credit_request_decide(request: UserRequest, pk: int, decision: str) -> HttpResponse:
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
def ops_credit_rate(request: UserRequest) -> HttpResponse:
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


@member_required
@require_GET
def usage(request: MemberRequest) -> HttpResponse:
    """The tenant's usage over a range of days, its totals against the ledger, and the CSV."""
    tenant = request.membership.tenant
    raw_from, raw_to = request.GET.get("from"), request.GET.get("to")
    error, status, summary, lines = None, 200, None, []
    try:
        period = exports.export_period(raw_from, raw_to)
    except ServiceError as exc:
        error, status, period = exc, 400, exports.export_period(None, None)
    else:
        slices = exports.usage_lines(tenant, period, section="slice")
        volumes = exports.usage_lines(tenant, period, section="volume")
        summary = exports.usage_summary(tenant, period, lines=slices + volumes)
        lines = slices[:USAGE_PAGE_ROWS] + volumes[:USAGE_PAGE_ROWS]
    return render(
        request,
        "tenants/usage.html",
        {
            "tenant": tenant,
            "error": error,
            "from": (raw_from or str(period.first))[:10],
            "to": (raw_to or str(period.last))[:10],
            "period": period,
            "summary": summary,
            "slices": [line for line in lines if line.section == "slice"],
            "volumes": [line for line in lines if line.section == "volume"],
            "rows_shown": USAGE_PAGE_ROWS,
            "csv_query": urlencode({"from": period.first, "to": period.last}),
        },
        status=status,
    )


@member_required
@require_GET
def usage_csv(request: MemberRequest) -> HttpResponseBase:
    """The export as one streamed CSV file (a bad range: back to the page, which says why)."""
    tenant = request.membership.tenant
    try:
        period = exports.export_period(request.GET.get("from"), request.GET.get("to"))
    except ServiceError:
        return redirect(reverse("tenants:usage") + "?" + request.GET.urlencode())
    response = StreamingHttpResponse(
        exports.csv_stream(tenant, period), content_type="text/csv; charset=utf-8"
    )
    name = exports.csv_filename(tenant, period)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
