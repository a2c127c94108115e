"""Pages of the slice lifecycle: the tenant's dashboard, buy, launch and slice pages, and
the ops pages for slices, credit, the image allowlist and calibration.

Every page works as plain forms; htmx only refreshes the live parts, and a live part
answers HTTP 286 (htmx: stop polling) once nothing in it can change any more.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.db.models import Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.pages import is_partial, live_response
from gpuplatform.querystring import is_id

from . import fit, selectors, services
from .context_processors import request_credit_rate
from .fit import JobForm, error_summary, estimate_for
from .forms import CreditDecisionForm, CreditRateForm, CreditRequestForm
from .lifecycle_forms import (
    BuyForm,
    CreditGrantForm,
    ForceStopForm,
    ImageForm,
    LaunchEstimateForm,
    LaunchForm,
    RefundForm,
    SliceFilterForm,
    StopForm,
    new_form_token,
    slices_holding_purchases,
)
from .models import Image, LedgerEntry, Purchase, Slice, Tenant
from .views import member_required

LIVE_SECONDS = 3
OPS_PAGE_SIZE = 25
GAUGE_WINDOW_MINUTES = 10


def _form_error(form, exc: ServiceError) -> None:  # type: ignore[no-untyped-def]
    """Put a service's message on the field it names (`model.batch` -> `batch`)."""
    field = exc.field or ""
    for name in (field, field.rpartition(".")[2], field.partition(".")[0]):
        if name and name in form.fields:
            form.add_error(name, exc.message)
            return
    form.add_error(None, exc.message)


# --- reads for these pages ------------------------------------------------------------------


def latest_vram_mb(slices: list[Slice]) -> dict[int, int]:
    """The VRAM each running slice's container held in its latest sample (one query).

    Only the last few minutes are scanned: an older reading is not "now"."""
    from nodes.models import ProcessSample

    running = [
        s for s in slices if s.state == Slice.State.RUNNING and s.allocation_id and s.container_id
    ]
    if not running:
        return {}
    since = timezone.now() - timedelta(minutes=GAUGE_WINDOW_MINUTES)
    cond = Q()
    for s in running:
        cond |= Q(gpu_id=s.allocation.gpu_id, container_id=s.container_id)  # type: ignore[union-attr]
    rows = (
        ProcessSample.objects.filter(cond, taken_at__gte=since)
        .values("gpu_id", "container_id", "taken_at")
        .annotate(used_mb=Sum("used_memory_mb"))
        .order_by("-taken_at")
    )
    latest: dict[tuple[int, str], int] = {}
    for row in rows:
        latest.setdefault((row["gpu_id"], row["container_id"]), row["used_mb"])
    return {
        s.pk: latest[(s.allocation.gpu_id, s.container_id)]  # type: ignore[union-attr]
        for s in running
        if (s.allocation.gpu_id, s.container_id) in latest  # type: ignore[union-attr]
    }


def _with_gauges(slices: list[Slice]) -> list[Slice]:
    used = latest_vram_mb(slices)
    for s in slices:
        s.used_mb = used.get(s.pk)  # type: ignore[attr-defined]
        s.used_pct = round(100 * s.used_mb / s.vram_mb) if s.used_mb and s.vram_mb else 0  # type: ignore[attr-defined]
    return slices


def low_purchases(tenant: Tenant):  # type: ignore[no-untyped-def]
    """Purchases about to run out: the warning metering records at 10 minutes left."""
    return (
        Purchase.objects.for_tenant(tenant)
        .select_related("tier")
        .filter(refunded_at__isnull=True, minutes_left__gt=0)
        .filter(
            Q(low_warning_at__isnull=False) | Q(minutes_left__lte=services.LOW_TIME_WARNING_MINUTES)
        )
    )


# --- tenant: dashboard ------------------------------------------------------------------------


def _dashboard_live_context(tenant: Tenant) -> dict:
    slices = _with_gauges(list(selectors.slice_list(tenant=tenant)[:20]))
    purchases = list(selectors.purchase_list(tenant=tenant)[:20])
    for p in purchases:
        p.usable = p.minutes_left > 0 and not p.live_slices and p.refunded_at is None  # type: ignore[attr-defined]
    any_live = Slice.objects.for_tenant(tenant).filter(state__in=Slice.LIVE_STATES).exists()
    return {
        "slices": slices,
        "purchases": purchases,
        "low": list(low_purchases(tenant)),
        "any_live": any_live,
        "live_seconds": LIVE_SECONDS,
    }


@member_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    tenant = request.membership.tenant
    context = _dashboard_live_context(tenant)
    if is_partial(request):
        response = render(request, "tenants/_dashboard_live.html", context)
        return live_response(response, done=not context["any_live"])
    credit_requests = list(selectors.credit_request_list(tenant=tenant)[:5])
    context.update(
        membership=request.membership,
        tenant=tenant,
        ledger=selectors.ledger_list(tenant=tenant)[:10],
        credit_requests=credit_requests,
        credit_pending=next((r for r in credit_requests if r.status == "pending"), None),
        credit_form=CreditRequestForm(),
        # The first steps stay on the page until the tenant has launched something.
        getting_started=not context["slices"],
    )
    return render(request, "tenants/dashboard.html", context)


# --- tenant: buy ------------------------------------------------------------------------------


@member_required
@require_http_methods(["GET", "POST"])
def buy(request: HttpRequest) -> HttpResponse:
    """Choose a tier and hours, confirm the total, buy once (the form's token is the key)."""
    tenant = request.membership.tenant
    rate = request_credit_rate(request)
    form = BuyForm(request.POST or None, initial=_buy_initial(request), rate=rate)
    status = 200
    confirming = False
    insufficient = False
    if request.method == "POST" and form.is_valid():
        if request.POST.get("confirm") != "yes":
            confirming = True  # step 2: show the total, post again to buy
        else:
            try:
                purchase, created = services.purchase_create(
                    membership=request.membership,
                    tier=form.cleaned_data["tier"],
                    hours=form.cleaned_data["hours"],
                    idempotency_key=form.cleaned_data["idempotency_token"],
                )
            except ServiceError as exc:
                _form_error(form, exc)
                status = exc.status_code
                insufficient = exc.code == "insufficient_credit"
            else:
                if created:
                    messages.success(
                        request,
                        f"Bought {purchase.tier.name} for {purchase.hours} h "
                        f"({purchase.price_paid} credits).",
                    )
                else:
                    messages.info(request, "That purchase was already made; nothing was charged.")
                return redirect("tenants:dashboard")
    elif request.method == "POST":
        status = 400
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
            "prices": {str(t.pk): str(t.price_per_hour) for t in tiers},
            # buy.js writes the live total the way tenants.money does (same rounding, signs).
            "rate": {
                "currency": rate.currency,
                "per_credit": str(rate.per_credit),
                "symbol": rate.symbol,
                "places": rate.places,
            },
            "insufficient": insufficient,
        },
        status=status,
    )


def _buy_initial(request: HttpRequest) -> dict:
    tier = request.GET.get("tier", "")
    return {"tier": int(tier)} if is_id(tier) else {}


# --- tenant: launch ---------------------------------------------------------------------------


def _launch_estimate(tenant: Tenant, data, tiers: list) -> dict:  # type: ignore[no-untyped-def]
    """The launch page's estimate panel for the job in `data` (its error slots included)."""
    form = LaunchEstimateForm(data, tenant=tenant, tiers=tiers)
    if form.is_valid():
        context = estimate_for(form, form.to_mapping(), tiers=tiers)
    else:
        context = {"error": error_summary(form)}
    return {"estimate_form": form, "error_fields": _job_fields(form), **context}


def _job_fields(form):  # type: ignore[no-untyped-def]
    return [form[name] for name in JobForm.base_fields if name in form.fields]


def _launch_initial_job(form: LaunchForm) -> dict:
    """The job as the unbound page shows it, for the first estimate."""
    data = {
        name: form[name].value()
        for name in JobForm.base_fields
        if name in form.fields and form[name].value() not in (None, False)
    }
    offered = [p.pk for p in form.usable]
    chosen = form["purchase"].value()
    if offered:
        data["purchase"] = str(chosen if chosen in offered else offered[0])
    return data


def _launch_blocked(membership, form: LaunchForm, has_images: bool, in_use: list) -> str:  # type: ignore[no-untyped-def]
    """Why nothing can launch from this page now ("" when something can)."""
    if not membership.tenant.is_active:
        return "This tenant is suspended."
    if not membership.can_write:
        return "Viewers cannot launch slices."
    reasons = []
    if not form.usable:
        reasons.append(
            "Every purchase with minutes left is running a slice."
            if in_use
            else "No purchase with minutes left."
        )
    if not has_images:
        reasons.append("No image is on the allowlist.")
    return " ".join(reasons)


@member_required
@require_http_methods(["GET", "POST"])
def launch(request: HttpRequest) -> HttpResponse:
    tenant = request.membership.tenant
    tiers = list(selectors.tier_list())
    if request.method == "GET" and "estimate" in request.GET and is_partial(request):
        # The live estimate (launch.js): the panel, and the job fields' error slots.
        context = _launch_estimate(tenant, request.GET, tiers)
        return render(request, "tenants/_launch_estimate.html", {**context, "partial": True})
    initial = {}
    wanted = request.GET.get("purchase", "")
    if is_id(wanted):
        initial["purchase"] = int(wanted)
    form = LaunchForm(request.POST or None, tenant=tenant, initial=initial)
    status = 200
    refusal = None
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            data = form.cleaned_data
            try:
                slice, created = services.slice_launch(
                    membership=request.membership,
                    purchase=data["purchase"],
                    image=data["image"],
                    model_request=form.model_request(),
                    command=data["command"],
                    environment=data["environment"],
                    ssh_public_key=data["ssh_public_key"],
                    guaranteed=data["guaranteed"],
                    idempotency_key=data["idempotency_token"],
                )
            except services.ServiceRefusal as exc:
                refusal = {"message": exc.message, "estimate": exc.estimate, "slice": exc.slice}
                status = exc.status_code
                # The refused launch is recorded under this key: a corrected form needs a new one.
                form = LaunchForm(_fresh_token(request.POST), tenant=tenant)
                form.is_valid()
            except ServiceError as exc:
                _form_error(form, exc)
                status = exc.status_code
            else:
                if not created:
                    messages.info(request, "This launch was already submitted.")
                return redirect("tenants:slice_detail", pk=slice.pk)
    purchase_tiers = {str(p.pk): p.tier.vram_mb for p in form.usable}
    has_images = form.fields["image"].queryset.exists()
    in_use = [] if form.usable else slices_holding_purchases(tenant)
    job = request.POST if request.method == "POST" else _launch_initial_job(form)
    return render(
        request,
        "tenants/launch.html",
        {
            **_launch_estimate(tenant, job, tiers),
            "form": form,
            "refusal": refusal,
            "purchase_tiers": purchase_tiers,
            "has_purchases": bool(purchase_tiers),
            "in_use": in_use,
            "launch_blocked": _launch_blocked(request.membership, form, has_images, in_use),
            "has_images": has_images,
            "ssh_images": list(
                form.fields["image"]
                .queryset.filter(connect=Image.Connect.SSH)
                .values_list("pk", flat=True)
            ),
        },
        status=status,
    )


def _fresh_token(data):  # type: ignore[no-untyped-def]
    data = data.copy()
    data["idempotency_token"] = new_form_token()
    return data


# --- tenant: one slice ------------------------------------------------------------------------


def _tenant_slice(request: HttpRequest, pk: int) -> Slice:
    return get_object_or_404(selectors.slice_list(tenant=request.membership.tenant), pk=pk)


def _slice_context(slice: Slice, membership=None) -> dict:  # type: ignore[no-untyped-def]
    from .api.lifecycle_serializers import redact_for_viewers

    # Viewers see the slice, not its keys (the same rule as the API).
    slice.connection = redact_for_viewers(
        {"connection": slice.connection, "environment": slice.environment}, membership
    )["connection"]
    series = selectors.slice_vram_series(slice=slice)
    peak_so_far = max((p["used_mb"] for p in series), default=None)
    used = latest_vram_mb([slice]).get(slice.pk)
    return {
        "slice": slice,
        "transitions": list(selectors.slice_transitions(slice=slice)),
        "queue_position": services.queue_position(slice),
        "series": series,
        "chart": {
            "labels": [p["t"] for p in series],
            "used_mb": [p["used_mb"] for p in series],
            "quota_mb": slice.vram_mb,
        },
        "used_mb": used,
        "used_pct": round(100 * used / slice.vram_mb) if used and slice.vram_mb else 0,
        "peak_mb": slice.peak_vram_mb if slice.peak_vram_mb is not None else peak_so_far,
        "can_stop": not slice.is_final and slice.state != Slice.State.STOPPING,
        "live_seconds": LIVE_SECONDS,
        # A refused slice shows its estimate as the pages do: tiers named, the buy link.
        "refused": fit.present(slice.estimate, tiers=list(selectors.tier_list()))
        if slice.state == Slice.State.REFUSED and (slice.estimate or {}).get("terms")
        else None,
    }


@member_required
@require_GET
def slice_detail(request: HttpRequest, pk: int) -> HttpResponse:
    slice = _tenant_slice(request, pk)
    context = _slice_context(slice, request.membership)
    if is_partial(request):
        response = render(request, "tenants/_slice_live.html", context)
        return live_response(response, done=slice.is_final)
    return render(request, "tenants/slice_detail.html", context)


@member_required
@require_http_methods(["GET", "POST"])
def slice_stop(request: HttpRequest, pk: int) -> HttpResponse:
    """GET asks to confirm; only the confirmation form's POST stops (or cancels) it."""
    slice = _tenant_slice(request, pk)
    if slice.is_final:
        messages.info(request, f"This slice is already {slice.state}.")
        return redirect("tenants:slice_detail", pk=slice.pk)
    status = 200
    if request.method == "POST":
        if StopForm(request.POST).is_valid():
            try:
                slice = services.slice_stop(slice=slice, actor=request.user)
            except ServiceError as exc:
                messages.error(request, exc.message)
            else:
                messages.success(request, slice.state_reason or f"Slice {slice.pk} is stopping.")
            return redirect("tenants:slice_detail", pk=slice.pk)
        status = 400
    return render(request, "tenants/slice_stop.html", {"slice": slice}, status=status)


# --- ops: slices ------------------------------------------------------------------------------


def _ops_slices(form: SliceFilterForm):  # type: ignore[no-untyped-def]
    qs = selectors.slice_list_for_ops()
    if not form.is_valid():
        return qs
    data = form.cleaned_data
    if data.get("state"):
        qs = qs.filter(state=data["state"])
    if data.get("tenant"):
        qs = qs.filter(tenant=data["tenant"])
    if data.get("node"):
        qs = qs.filter(allocation__gpu__node=data["node"])
    if data.get("image"):
        qs = qs.filter(image_entry=data["image"])
    return qs


@staff_member_required
@require_GET
def ops_slices(request: HttpRequest) -> HttpResponse:
    form = SliceFilterForm(request.GET or None)
    page = Paginator(_ops_slices(form), OPS_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "tenants/ops_slices.html",
        {"form": form, "page": page, "query": query.urlencode()},
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_slice_stop(request: HttpRequest, pk: int) -> HttpResponse:
    slice = get_object_or_404(selectors.slice_list_for_ops(), pk=pk)
    form = ForceStopForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                services.slice_stop(
                    slice=slice, actor=request.user, reason=form.cleaned_data["reason"], force=True
                )
            except ServiceError as exc:
                messages.error(request, exc.message)
            else:
                messages.success(request, f"Slice {slice.pk} of {slice.tenant.name} force-stopped.")
            return redirect("tenants:ops_slices")
        status = 400
    return render(
        request, "tenants/ops_slice_stop.html", {"slice": slice, "form": form}, status=status
    )


# --- ops: credit and refunds ------------------------------------------------------------------


def recent_grants(limit: int = 20):  # type: ignore[no-untyped-def]
    return (
        LedgerEntry.objects.filter(kind=LedgerEntry.Kind.GRANT)
        .select_related("tenant", "actor")
        .order_by("-created_at", "-id")[:limit]
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_credit(request: HttpRequest) -> HttpResponse:
    q = request.GET.get("q", "").replace("\x00", "").strip()[:100]
    tenants = selectors.tenant_list_for_ops(search=q)
    form = CreditGrantForm(request.POST or None, tenants=tenants if q else None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                entry = services.credit_grant(
                    tenant=data["tenant"],
                    amount=data["amount"],
                    actor=request.user,
                    memo=data["memo"],
                    idempotency_key=data.get("idempotency_token") or "",
                )
            except ServiceError as exc:
                _form_error(form, exc)
                status = exc.status_code
            else:
                messages.success(
                    request,
                    f"{entry.amount:.2f} credits granted to {data['tenant'].name}; "
                    f"balance {entry.balance_after}.",
                )
                return redirect(
                    reverse("tenants:ops_credit") + (f"?{urlencode({'q': q})}" if q else "")
                )
        else:
            status = 400
    refund_tenant = request.GET.get("tenant", "")
    purchases = selectors.purchase_list_for_ops(
        tenant_id=int(refund_tenant) if is_id(refund_tenant) else None
    ).filter(minutes_left__gt=0, refunded_at__isnull=True)[:50]
    rate = request_credit_rate(request)
    return render(
        request,
        "tenants/ops_credit.html",
        {
            "form": form,
            "q": q,
            "matches": tenants.count() if q else None,
            "grants": recent_grants(),
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
        status=status,
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_refund(request: HttpRequest, pk: int) -> HttpResponse:
    purchase = get_object_or_404(selectors.purchase_list_for_ops(), pk=pk)
    form = RefundForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                entry = services.purchase_refund(
                    purchase=purchase, actor=request.user, memo=form.cleaned_data["memo"]
                )
            except ServiceError as exc:
                messages.error(request, exc.message)
                status = exc.status_code
            else:
                amount = entry.amount if entry is not None else Decimal("0.00")
                messages.success(request, f"Refunded {amount} credits to {purchase.tenant.name}.")
                return redirect("tenants:ops_credit")
        else:
            status = 400
    return render(
        request,
        "tenants/ops_refund.html",
        {"purchase": purchase, "form": form, "amount": purchase.refund_due},
        status=status,
    )


# --- ops: image allowlist ---------------------------------------------------------------------


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_images(request: HttpRequest) -> HttpResponse:
    form = ImageForm(request.POST or None, initial={"connect": Image.Connect.SSH, "ports": "22"})
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                image = services.image_create(actor=request.user, **form.cleaned_data)
            except ServiceError as exc:
                _form_error(form, exc)
                status = exc.status_code
            else:
                messages.success(request, f"{image.name} ({image.pinned_reference}) is allowed.")
                return redirect("tenants:ops_images")
        else:
            status = 400
    return render(
        request,
        "tenants/ops_images.html",
        {"form": form, "images": selectors.image_list(active_only=False)},
        status=status,
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_image_edit(request: HttpRequest, pk: int) -> HttpResponse:
    image = get_object_or_404(Image, pk=pk)
    form = ImageForm(request.POST or None, initial=ImageForm.initial_for(image))
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                image = services.image_update(actor=request.user, image=image, **form.cleaned_data)
            except ServiceError as exc:
                _form_error(form, exc)
                status = exc.status_code
            else:
                messages.success(request, f"{image.name} saved.")
                return redirect("tenants:ops_images")
        else:
            status = 400
    return render(
        request, "tenants/ops_image_edit.html", {"form": form, "image": image}, status=status
    )


@staff_member_required
@require_POST
def ops_image_active(request: HttpRequest, pk: int) -> HttpResponse:
    """Deactivate (no new launches; running slices keep it) or allow again."""
    image = get_object_or_404(Image, pk=pk)
    active = request.POST.get("is_active") == "1"
    try:
        services.image_update(actor=request.user, image=image, is_active=active)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request,
            f"{image.name} is allowed again."
            if active
            else f"{image.name} is deactivated: no new launches; running slices keep it.",
        )
    return redirect("tenants:ops_images")


# --- ops: calibration -------------------------------------------------------------------------


@staff_member_required
@require_GET
def ops_calibration(request: HttpRequest) -> HttpResponse:
    rows = selectors.calibration_rows()
    chart = {
        "points": [
            {
                "x": r["estimate_mean_mb"],
                "y": r["peak_mean_mb"],
                "label": f"{r['image']} · {r['model']}",
            }
            for r in rows
        ],
    }
    return render(request, "tenants/ops_calibration.html", {"rows": rows, "chart": chart})
