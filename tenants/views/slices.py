"""Slice pages: the tenant's dashboard, launch and slice pages, and the ops pages for
slices, the image allowlist and the estimator's calibration.

Every page works as plain forms; htmx only refreshes the live parts, and a live part
answers HTTP 286 (htmx: stop polling) once nothing in it can change any more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.forms import BoundField
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.http import MemberRequest, UserRequest
from gpuplatform.pages import PAGE_SIZE, is_partial, live_response, submit
from gpuplatform.querystring import is_id

from .. import selectors, services
from ..forms.billing import CreditRequestForm
from ..forms.estimate import JobForm, error_summary
from ..forms.fields import new_form_token
from ..forms.slices import (
    ForceStopForm,
    ImageForm,
    LaunchEstimateForm,
    LaunchForm,
    SliceFilterForm,
    StopForm,
    template_initial,
)
from ..models import Image, LaunchTemplate, Membership, Slice, Tenant, Tier
from ..permissions import member_required, redact_for_viewers
from ..selectors.slices import slice_runs
from .estimate import estimate_for, present
from .terminal import allow_edge, terminal_context

LIVE_SECONDS = 3


def _with_gauges(slices: list[Slice]) -> list[Slice]:
    # The gauge rides on each slice for the template (an attribute set on purpose).
    used = selectors.slices_latest_vram_mb(slices)
    for s in slices:
        s.used_mb = used.get(s.pk)  # type: ignore[attr-defined]
        s.quota_mb = selectors.slice_vram_quota(s).mb  # type: ignore[attr-defined]
        s.used_pct = round(100 * s.used_mb / s.quota_mb) if s.used_mb and s.quota_mb else 0  # type: ignore[attr-defined]
    return slices


def _dashboard_live_context(tenant: Tenant) -> dict[str, Any]:
    slices = _with_gauges(list(selectors.slice_list_for_dashboard(tenant=tenant)[:20]))
    purchases = list(selectors.purchase_list(tenant=tenant)[:20])
    any_live = Slice.objects.for_tenant(tenant).filter(state__in=Slice.LIVE_STATES).exists()
    return {
        "slices": slices,
        "purchases": purchases,
        "low": list(selectors.purchases_running_low(tenant)),
        "any_live": any_live,
        "live_seconds": LIVE_SECONDS,
    }


@member_required
@require_GET
def dashboard(request: MemberRequest) -> HttpResponse:
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
        spend=selectors.spend_summary(tenant=tenant),
    )
    return render(request, "tenants/dashboard.html", context)


def _launch_estimate(
    request: MemberRequest, data: Mapping[str, Any], tiers: list[Tier]
) -> dict[str, Any]:
    """The launch page's estimate panel for the job in `data` (its error slots included)."""
    tenant = request.membership.tenant
    form = LaunchEstimateForm(data, tenant=tenant, tiers=tiers)
    context: dict[str, Any]
    if form.is_valid():
        context = estimate_for(form, form.to_mapping(), tiers=tiers, request=request)
    else:
        context = {"error": error_summary(form)}
    return {"estimate_form": form, "error_fields": _job_fields(form), **context}


def _job_fields(form: JobForm) -> list[BoundField]:
    return [form[name] for name in JobForm.base_fields if name in form.fields]


def _launch_initial_job(form: LaunchForm) -> dict[str, Any]:
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


def _launch_template(request: HttpRequest) -> LaunchTemplate | None:
    """The template the page starts from: ?template= on a GET, the form's on a POST."""
    wanted = (request.POST if request.method == "POST" else request.GET).get("template", "")
    if not is_id(wanted):
        return None
    return selectors.template_list().filter(pk=int(wanted)).first()


def _sizing_for(
    template: LaunchTemplate | None, form: LaunchForm, tiers: list[Tier]
) -> list[dict[str, Any]]:
    """The engine flag per card for the tier of the purchase the form shows (every tier
    before one is chosen), from the tiers the page has read."""
    if template is None:
        return []
    chosen = str(form["purchase"].value() or "")
    tier = next((p.tier.vram_mb for p in form.usable if str(p.pk) == chosen), None)
    shown = [t for t in tiers if tier is None or t.vram_mb == tier]
    return selectors.template_sizing(template, tiers=shown)


def _launch_blocked(
    membership: Membership, form: LaunchForm, has_images: bool, in_use: list[Slice]
) -> str:
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
def launch(request: MemberRequest) -> HttpResponse:
    tenant = request.membership.tenant
    tiers = list(selectors.tier_list())
    if request.method == "GET" and "estimate" in request.GET and is_partial(request):
        # The live estimate (launch.js): the panel, and the job fields' error slots.
        context = _launch_estimate(request, request.GET, tiers)
        return render(request, "tenants/_launch_estimate.html", {**context, "partial": True})
    chosen = _launch_template(request)
    form = LaunchForm(
        request.POST or None,
        tenant=tenant,
        user=request.user,
        initial=_launch_initial(request, chosen),
    )
    launched = submit(
        request,
        form,
        lambda data: services.slice_launch_request(
            membership=request.membership, request=form.launch_request()
        ),
        field_for=form.error_field_of,  # a mount's error goes on its row
    )
    status = launched.status
    refusal = None
    if launched.done and launched.result.refusal is None:
        if not launched.result.created:
            messages.info(request, "This launch was already submitted.")
        return redirect("tenants:slice_detail", pk=launched.result.slice.pk)
    if launched.done:  # the VRAM check said no (now, or for this form's first submit)
        result = launched.result
        refusal = {**asdict(result.refusal), "slice": result.slice}
        status = 422
        # The refused launch is recorded under this key: a corrected form needs a new one.
        form = LaunchForm(_fresh_token(request.POST), tenant=tenant, user=request.user)
        form.is_valid()
    context = _launch_context(request, form, tiers, template=chosen, refusal=refusal)
    return render(request, "tenants/launch.html", context, status=status)


def _launch_initial(request: HttpRequest, template: LaunchTemplate | None) -> dict[str, Any]:
    """The unbound form's start: the purchase asked for (?purchase=), a GET's template."""
    initial: dict[str, Any] = {}
    wanted = request.GET.get("purchase", "")
    if is_id(wanted):
        initial["purchase"] = int(wanted)
    if template is not None and request.method == "GET":
        initial.update(template_initial(template))
    return initial


def _launch_context(
    request: MemberRequest,
    form: LaunchForm,
    tiers: list[Tier],
    *,
    template: LaunchTemplate | None,
    refusal: dict[str, Any] | None,
) -> dict[str, Any]:
    """The launch page: the form, the estimate of its job, what it can launch from (or why
    nothing can launch now), the template it started from."""
    tenant = request.membership.tenant
    images = form.images
    purchase_tiers = {str(p.pk): p.tier.vram_mb for p in form.usable}
    has_images = images.exists() or form.brings_images  # or an image of the tenant's own
    in_use = [] if form.usable else selectors.slices_holding_purchases(tenant)
    job = request.POST if request.method == "POST" else _launch_initial_job(form)
    return {
        **_launch_estimate(request, job, tiers),
        "form": form,
        "refusal": refusal,
        "purchase_tiers": purchase_tiers,
        "has_purchases": bool(purchase_tiers),
        "in_use": in_use,
        "launch_blocked": _launch_blocked(request.membership, form, has_images, in_use),
        "has_images": has_images,
        # images no node taking slices holds: a launch would need a pull
        "image_notes": selectors.images_needing_pull(images),
        "templates": selectors.template_list(),
        "template": template,
        "template_sizing": _sizing_for(template, form, tiers),
        "ssh_images": list(images.filter(connect=Image.Connect.SSH).values_list("pk", flat=True)),
    }


def _fresh_token(data: QueryDict) -> QueryDict:
    data = data.copy()
    data["idempotency_token"] = new_form_token()
    return data


def _tenant_slice(request: MemberRequest, pk: int) -> Slice:
    return get_object_or_404(selectors.slice_list(tenant=request.membership.tenant), pk=pk)


def _slice_context(slice: Slice, membership: Membership | None = None) -> dict[str, Any]:
    # Viewers see the slice, not its keys (the same rule as the API).
    slice.connection = redact_for_viewers(
        {"connection": slice.connection, "environment": slice.environment}, membership
    )["connection"]
    series = selectors.slice_vram_series(slice=slice)
    peak_so_far = max((p["used_mb"] for p in series), default=None)
    used = selectors.slices_latest_vram_mb([slice]).get(slice.pk)
    quota = selectors.slice_vram_quota(slice)
    return {
        "slice": slice,
        "transitions": list(selectors.slice_transitions(slice=slice)),
        "queue_position": selectors.queue_position(slice),
        "series": series,
        "chart": {
            "labels": [p["t"] for p in series],
            "used_mb": [p["used_mb"] for p in series],
            "quota_mb": quota.mb,
        },
        "quota": quota,
        "used_mb": used,
        "used_pct": round(100 * used / quota.mb) if used and quota.mb else 0,
        "peak_mb": slice.peak_vram_mb if slice.peak_vram_mb is not None else peak_so_far,
        "can_stop": not slice.is_final and slice.state != Slice.State.STOPPING,
        "live_seconds": LIVE_SECONDS,
        # A refused slice shows its estimate as the pages do: tiers named, the buy link.
        "refused": present(slice.estimate, tiers=list(selectors.tier_list()))
        if slice.state == Slice.State.REFUSED and (slice.estimate or {}).get("terms")
        else None,
    }


@member_required
@require_GET
def slice_detail(request: MemberRequest, pk: int) -> HttpResponse:
    slice = _tenant_slice(request, pk)
    context = _slice_context(slice, request.membership)
    if is_partial(request):
        response = render(request, "tenants/_slice_live.html", {**context, "partial": True})
        return live_response(response, done=slice.is_final)
    services.slice_logs_request(slice=slice)
    context.update(slice_log_tail(slice))
    context["run_history"] = list(slice_runs(slice=slice))
    context.update(terminal_context(slice, request.membership))
    return allow_edge(render(request, "tenants/slice_detail.html", context))


@member_required
@require_http_methods(["GET", "POST"])
def slice_stop(request: MemberRequest, pk: int) -> HttpResponse:
    """GET asks to confirm; only the confirmation form's POST stops (or cancels) it."""
    slice = _tenant_slice(request, pk)
    if slice.is_final:
        messages.info(request, f"This slice is already {slice.state}.")
        return redirect("tenants:slice_detail", pk=slice.pk)
    stopped = submit(
        request,
        StopForm(request.POST or None),
        lambda _: services.slice_stop(slice=slice, actor=request.user),
        refusal="messages",
    )
    if stopped.done:
        reason = stopped.result.state_reason
        messages.success(request, reason or f"Slice {slice.pk} is stopping.")
    if stopped.done or stopped.refused:
        return redirect("tenants:slice_detail", pk=slice.pk)
    return render(request, "tenants/slice_stop.html", {"slice": slice}, status=stopped.status)


@staff_member_required
@require_GET
def ops_slices(request: UserRequest) -> HttpResponse:
    form = SliceFilterForm(request.GET or None)
    page = Paginator(selectors.slice_list_for_ops(**form.filters()), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "tenants/ops_slices.html",
        {"form": form, "page": page, "query": query.urlencode()},
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_slice_stop(request: UserRequest, pk: int) -> HttpResponse:
    slice = get_object_or_404(selectors.slice_list_for_ops(), pk=pk)
    form = ForceStopForm(request.POST or None)
    stopped = submit(
        request,
        form,
        lambda data: services.slice_stop(
            slice=slice, actor=request.user, reason=data["reason"], force=True
        ),
        refusal="messages",
    )
    if stopped.done:
        messages.success(request, f"Slice {slice.pk} of {slice.tenant.name} force-stopped.")
    if stopped.done or stopped.refused:
        return redirect("tenants:ops_slices")
    return render(
        request,
        "tenants/ops_slice_stop.html",
        {"slice": slice, "form": form},
        status=stopped.status,
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_images(request: UserRequest) -> HttpResponse:
    form = ImageForm(request.POST or None, initial={"connect": Image.Connect.SSH, "ports": "22"})
    added = submit(request, form, lambda data: services.image_create(actor=request.user, **data))
    if added.done:
        image = added.result
        messages.success(request, f"{image.name} ({image.pinned_reference}) is allowed.")
        return redirect("tenants:ops_images")
    return render(
        request,
        "tenants/ops_images.html",
        {"form": form, "images": selectors.image_list(active_only=False)},
        status=added.status,
    )


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_image_edit(request: UserRequest, pk: int) -> HttpResponse:
    image = get_object_or_404(Image, pk=pk)
    form = ImageForm(request.POST or None, initial=ImageForm.initial_for(image))
    saved = submit(
        request,
        form,
        lambda data: services.image_update(actor=request.user, image=image, **data),
    )
    if saved.done:
        messages.success(request, f"{saved.result.name} saved.")
        return redirect("tenants:ops_images")
    return render(
        request, "tenants/ops_image_edit.html", {"form": form, "image": image}, status=saved.status
    )


@staff_member_required
@require_POST
def ops_image_active(request: UserRequest, pk: int) -> HttpResponse:
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


@staff_member_required
@require_GET
def ops_calibration(request: UserRequest) -> HttpResponse:
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


LOG_LINES_SHOWN = 200  # the page opens on the last lines kept
LOG_LINES_PER_POLL = 500


@member_required
@require_GET
def slice_logs(request: MemberRequest, pk: int) -> HttpResponse:
    """The lines after `after` (htmx appends them to the page's log box), and the poller
    that asks for the next ones; it stops once the slice is final and nothing is left."""
    slice = _tenant_slice(request, pk)
    after = request.GET.get("after", "0")
    if not is_id(after) and after != "0":
        return HttpResponse("after: a line number", status=400, content_type="text/plain")
    services.slice_logs_request(slice=slice)
    lines = selectors.slice_log_lines(slice=slice, after=int(after), limit=LOG_LINES_PER_POLL)
    following = slice.state in (Slice.State.RUNNING, Slice.State.STOPPING)
    cursor = lines[-1].seq if lines else int(after)
    done = not following and len(lines) < LOG_LINES_PER_POLL
    response = render(
        request,
        "tenants/_slice_log_lines.html",
        {"slice": slice, "lines": lines, "cursor": cursor, "done": done},
    )
    return live_response(response, done=done)


def slice_log_tail(slice: Slice) -> dict[str, Any]:
    """The log box as the slice page opens it: the last lines kept and the cursor."""
    lines = list(reversed(list(selectors.slice_log_lines_tail(slice=slice, count=LOG_LINES_SHOWN))))
    return {"log_lines": lines, "log_cursor": lines[-1].seq if lines else 0}
