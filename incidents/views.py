"""Incident pages. Ops: the ledger (filters, search, sorting, bulk acknowledge, CSV
export, live refresh), one incident (evidence, evidence chart, runbook timeline, actions
behind a confirmation), the KPIs and the watchdog thresholds. Tenants: the incidents
about their own slices, in plain words, with no node, GPU or other tenant in sight.

Every page works as plain forms; htmx only refreshes the live parts, and the incident
page's live part answers HTTP 286 (stop polling) once the incident is resolved.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.http import MemberRequest, UserRequest
from gpuplatform.pages import error_field, is_partial, live_response, submit
from gpuplatform.querystring import is_id
from tenants.permissions import member_required

from . import kpis, paging, selectors, services
from .forms import (
    ConfirmForm,
    IncidentFilterForm,
    PeriodForm,
    ReasonForm,
    ReopenForm,
    ResolveForm,
    StopSliceForm,
    ThresholdsForm,
)
from .models import Incident, IncidentEvent
from .notify import tenant_slices, tenant_text, tenant_title

LIVE_SECONDS = 10
E = IncidentEvent.Kind
RUNBOOK = [
    (E.DETECTED, "Detected"),
    (E.LOCATED, "Located"),
    (E.CLASSIFIED, "Classified"),
    (E.DISPOSED, "Disposed"),
    (E.ARCHIVED, "Archived"),
]


def _ledger_url(query: str = "") -> str:
    # Re-encoded so only a query string of ours follows the ledger's path.
    clean = QueryDict(query).urlencode()
    return reverse("incidents:ops_incidents") + (f"?{clean}" if clean else "")


# --- ops: the ledger --------------------------------------------------------------------------


@staff_member_required
@require_GET
def ops_incidents(request: UserRequest) -> HttpResponse | StreamingHttpResponse:
    form = IncidentFilterForm(request.GET or None)
    args = form.selector_args()
    incidents = selectors.incident_list(**args)
    if request.GET.get("format") == "csv":
        if form.is_bound and not form.is_valid():
            return _export_refused(form)
        return csv_response(incidents)
    page = paging.incident_page(incidents, sort=args["sort"], params=request.GET)
    query = request.GET.copy()
    for name in ("page", "after", "before", "format"):
        query.pop(name, None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "live_seconds": LIVE_SECONDS,
        "now": timezone.now(),
    }
    if is_partial(request):
        return render(request, "incidents/_ledger_live.html", context)
    return render(request, "incidents/ops_ledger.html", context)


@staff_member_required
@require_GET
def ops_incidents_export(request: UserRequest) -> HttpResponse | StreamingHttpResponse:
    form = IncidentFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():  # said before the stream starts, not in it
        return _export_refused(form)
    return csv_response(selectors.incident_list(**form.selector_args()))


def _export_refused(form: IncidentFilterForm) -> HttpResponse:
    lines = [f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items()]
    return HttpResponse(
        "Nothing exported: " + "; ".join(lines) + "\n",
        status=400,
        content_type="text/plain; charset=utf-8",
    )


@staff_member_required
@require_POST
def ops_incidents_acknowledge(request: UserRequest) -> HttpResponse:
    """Bulk acknowledge the checked rows (the service skips any that are not open)."""
    ids = sorted({int(v) for v in request.POST.getlist("ids") if is_id(v)})
    if not ids:
        messages.info(request, "Select the incidents to acknowledge first.")
    else:
        try:
            done = services.incidents_acknowledge(ids=ids, actor=request.user)
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            skipped = len(ids) - done
            messages.success(
                request,
                f"{done} incident{'s' if done != 1 else ''} acknowledged"
                + (f"; {skipped} skipped (not open)." if skipped else "."),
            )
    return redirect(_ledger_url(request.POST.get("query", "")))


# --- ops: CSV export ----------------------------------------------------------------------------

CSV_HEADER = [
    "id",
    "rule",
    "title",
    "severity",
    "status",
    "class",
    "tenant",
    "node",
    "gpu",
    "slice",
    "first seen",
    "last seen",
    "occurrences",
    "acknowledged by",
    "acknowledged at",
    "resolved by",
    "resolved at",
    "note",
]
# A cell starting with one of these is a formula to a spreadsheet (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class _Echo:
    """csv.writer writes a row here and gets it back, so rows can be streamed."""

    def write(self, value: str) -> str:
        return value


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value)
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def _who(user: User | None) -> str:
    return (user.email or user.get_username()) if user is not None else ""


def _csv_rows(incidents: QuerySet[Incident]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_HEADER)
    for i in incidents.select_related("acknowledged_by", "resolved_by").iterator(chunk_size=500):
        node = i.node or (i.gpu.node if i.gpu else None)
        row = [
            i.pk,
            i.rule,
            i.title,
            i.severity,
            i.status,
            i.root_cause,
            i.tenant.name if i.tenant else "",
            node.name if node else "",
            i.gpu.uuid if i.gpu else "",
            i.slice_id,
            i.first_seen_at,
            i.last_seen_at,
            i.occurrences,
            _who(i.acknowledged_by) if i.acknowledged_by_id else "",
            i.acknowledged_at,
            _who(i.resolved_by) if i.resolved_by_id else ("system" if i.resolved_at else ""),
            i.resolved_at,
            i.resolution_note,
        ]
        yield writer.writerow([csv_cell(v) for v in row])


def csv_response(incidents: QuerySet[Incident]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(_csv_rows(incidents), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="incidents-{stamp}.csv"'
    return response


# --- ops: one incident --------------------------------------------------------------------------


def _ops_incident(pk: int) -> Incident:
    return get_object_or_404(
        Incident.objects.select_related(
            "tenant",
            "node",
            "gpu__node",
            "slice__allocation__gpu__node",
            "acknowledged_by",
            "resolved_by",
        ),
        pk=pk,
    )


def available_actions(incident: Incident) -> dict[str, bool]:
    """What the page offers (and the confirmations accept): disposal actions only while
    the incident is not resolved, and a stop only of the run it is about."""
    resolved = incident.status == Incident.Status.RESOLVED
    node = incident.affected_node
    return {
        "acknowledge": incident.status == Incident.Status.OPEN,
        "resolve": not resolved,
        "reopen": resolved,
        "stop_slice": not resolved and selectors.can_stop_incident_slice(incident),
        "drain_gpu": not resolved and selectors.can_drain_gpu(incident.gpu),
        "end_orphan": incident.rule == "orphan_process" and not resolved,
        "drain_node": not resolved and selectors.can_drain_node(node),
    }


def _points(window: Any) -> list[list[str | float]]:
    if not isinstance(window, list):
        return []
    return [
        [p[0], p[1]]
        for p in window
        if isinstance(p, list | tuple)
        and len(p) == 2
        and isinstance(p[0], str)
        and isinstance(p[1], int | float)
    ]


# Evidence keys shown in their own places on the page; the rest are listed as facts.
EVIDENCE_SHOWN = {"detail", "window", "processes", "slice", "xid_lines", "detected_at"}


def evidence_context(incident: Incident) -> dict[str, Any]:
    ev = incident.evidence if isinstance(incident.evidence, dict) else {}
    found_slice, found_window = ev.get("slice"), ev.get("window")
    slice_ev = found_slice if isinstance(found_slice, dict) else {}
    window = _points(found_window)
    raw_window = found_window if isinstance(found_window, list) else []
    quota = slice_ev.get("quota_mb") or ev.get("quota_mb")
    total = ev.get("total_mb") or (incident.gpu.vram_total_mb if incident.gpu else None)
    limit, limit_label = (quota, "slice quota (MiB)") if quota else (total, "GPU total (MiB)")
    processes = [p for p in ev.get("processes") or [] if isinstance(p, dict)]
    xids = [str(x) for x in ev.get("xid_lines") or [] if x is not None]
    facts = [
        (key.replace("_", " "), value)
        for key, value in sorted(ev.items())
        if key not in EVIDENCE_SHOWN and not isinstance(value, dict | list)
    ]
    return {
        "detail": ev.get("detail") or "",
        "detected_at": ev.get("detected_at") or "",
        "slice": slice_ev,
        "processes": processes,
        "xid_lines": xids,
        "facts": facts,
        "chart": {
            "labels": [p[0] for p in window],
            "used_mb": [p[1] for p in window],
            "limit_mb": limit if isinstance(limit, int | float) else None,
            "limit_label": limit_label,
        },
        # samples the window holds without a usable time or value: left out of the chart
        "window_skipped": len(raw_window) - len(window),
    }


def _incident_context(incident: Incident) -> dict[str, Any]:
    events = list(selectors.incident_timeline(incident=incident))
    latest = {e.kind: e for e in events}  # ordered by time: the last of each kind wins
    resolved = incident.status == Incident.Status.RESOLVED
    steps = [
        {
            "kind": kind,
            "label": label,
            "event": latest.get(kind) if kind != E.ARCHIVED or resolved else None,
        }
        for kind, label in RUNBOOK
    ]
    return {
        "incident": incident,
        "node": incident.affected_node,
        "steps": steps,
        "events": events,
        "evidence": evidence_context(incident),
        "actions": available_actions(incident),
        "resumed_since": selectors.resumed_since(incident),
        "live_seconds": LIVE_SECONDS,
    }


@staff_member_required
@require_GET
def ops_incident(request: UserRequest, pk: int) -> HttpResponse:
    incident = _ops_incident(pk)
    context = _incident_context(incident)
    if is_partial(request):
        response = render(request, "incidents/_incident_live.html", context)
        return live_response(response, done=incident.status == Incident.Status.RESOLVED)
    context["harms"] = selectors.incident_harms(incident=incident)
    return render(request, "incidents/ops_incident.html", context)


# --- ops: actions, each behind a confirmation ----------------------------------------------


def _acknowledge(request: UserRequest, incident: Incident, data: dict[str, Any]) -> str:
    services.incident_acknowledge(incident=incident, actor=request.user)
    return f"Incident #{incident.pk} acknowledged."


def _resolve(request: UserRequest, incident: Incident, data: dict[str, Any]) -> str:
    services.incident_resolve(incident=incident, actor=request.user, note=data["note"])
    return f"Incident #{incident.pk} resolved."


def _reopen(request: UserRequest, incident: Incident, data: dict[str, Any]) -> str:
    services.incident_reopen(incident=incident, actor=request.user, note=data.get("note", ""))
    return f"Incident #{incident.pk} reopened."


def _stop_slice(request: UserRequest, incident: Incident, data: dict[str, Any]) -> str:
    s = services.incident_stop_slice(incident=incident, actor=request.user, reason=data["reason"])
    return f"Slice {s.pk} is {s.state}; its tenant sees the reason."


def _drain_gpu(request: UserRequest, incident: Incident, data: dict[str, Any]) -> str:
    gpu = services.incident_drain_gpu(incident=incident, actor=request.user, reason=data["reason"])
    return f"{gpu.label} takes no new placements."


def _drain_node(request: UserRequest, incident: Incident, data: dict[str, Any]) -> str:
    node = services.incident_drain_node(
        incident=incident, actor=request.user, reason=data["reason"]
    )
    return f"Node {node.name} is draining: no new placements."


def _end_orphan(request: UserRequest, incident: Incident, data: dict[str, Any]) -> str:
    services.incident_confirm_orphan(incident=incident, actor=request.user)
    return (
        "Confirmed: the watchdog checks the node and removes it if it is still a platform "
        "container with no live slice; otherwise it is left to you, with a note."
    )


@dataclass(frozen=True)
class Action:
    form: type[forms.Form]
    run: Callable[[UserRequest, Incident, dict[str, Any]], str]
    title: str
    button: str
    explain: str
    unavailable: str


ACTIONS = {
    "acknowledge": Action(
        ConfirmForm,
        _acknowledge,
        "Acknowledge",
        "Acknowledge",
        "You take it: the ledger shows you as the one working on it.",
        "Only an open incident can be acknowledged.",
    ),
    "resolve": Action(
        ResolveForm,
        _resolve,
        "Resolve",
        "Resolve",
        "It is archived with your note; the watchdog opens a new one if it happens again.",
        "This incident is already resolved.",
    ),
    "reopen": Action(
        ReopenForm,
        _reopen,
        "Reopen",
        "Reopen",
        "It goes back to acknowledged, with you on the timeline.",
        "Only a resolved incident can be reopened.",
    ),
    "stop_slice": Action(
        StopSliceForm,
        _stop_slice,
        "Stop the slice",
        "Force-stop the slice",
        "Its container is killed at once, its VRAM released and metering stopped; the "
        "tenant is told why.",
        "No slice to stop for this incident: it has none, it has ended, it was resumed "
        "since (another run), or the incident is resolved.",
    ),
    "drain_gpu": Action(
        ReasonForm,
        _drain_gpu,
        "Drain the GPU",
        "Drain the GPU",
        "The GPU takes no new slices; those running on it continue. Open it again on the "
        "placement policy page.",
        "No GPU to drain: none is named, it already takes no placements, or the incident "
        "is resolved.",
    ),
    "end_orphan": Action(
        ConfirmForm,
        _end_orphan,
        "End the orphan",
        "End it",
        "The node is asked again first: only a platform container that no live slice owns "
        "is removed (a PID may have been reused since the sample).",
        "Only an open orphan-process incident can be confirmed.",
    ),
    "drain_node": Action(
        ReasonForm,
        _drain_node,
        "Drain the node",
        "Drain the node",
        "No GPU of the node takes new slices; those running continue. Undrain it on the "
        "node's page.",
        "No node to drain: none is named, it is already draining, or the incident is resolved.",
    ),
}


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_incident_action(request: UserRequest, pk: int, action: str) -> HttpResponse:
    """GET asks to confirm; only the confirmation form's POST acts."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise Http404
    incident = _ops_incident(pk)
    back = redirect("incidents:ops_incident", pk=incident.pk)
    if not available_actions(incident)[action]:
        messages.info(request, spec.unavailable)
        return back
    form = spec.form(request.POST if request.method == "POST" else None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                text = spec.run(request, incident, form.cleaned_data)
            except ServiceError as exc:
                name = error_field(form, exc.field)
                if name is None:
                    messages.error(request, exc.message)
                    return back
                form.add_error(name, exc.message)
                status = exc.status_code
            else:
                messages.success(request, text)
                return back
        else:
            status = 400
    return render(
        request,
        "incidents/ops_incident_action.html",
        {
            "incident": incident,
            "node": incident.affected_node,
            "action": action,
            "spec": spec,
            "form": form,
        },
        status=status,
    )


# --- ops: KPIs ----------------------------------------------------------------------------------


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


KPI_NODES_SHOWN = 25


@staff_member_required
@require_GET
def ops_kpis(request: UserRequest) -> HttpResponse:
    form = PeriodForm(request.GET or None)
    days = form.days_or_default()
    until = timezone.now()
    data = kpis.compute(since=until - timedelta(days=days), until=until)
    # The worst nodes first, and only the first of them unless asked: a 1,000-node fleet
    # would otherwise draw 1,000 rows and 1,000 bars for the few that matter.
    worst = sorted(
        data["by_node"],
        key=lambda r: (
            -(r["preemption_rate_pct"] or 0),
            -(r["per_1000_gpu_hours"] or 0),
            -r["incidents"],
            r["node"],
        ),
    )
    every_node = request.GET.get("nodes") == "all"
    data["by_node"] = worst if every_node else worst[:KPI_NODES_SHOWN]
    nodes_hidden = len(worst) - len(data["by_node"])
    for row in [data, *data["by_class"], *data["by_node"]]:
        row["mttd"] = duration_text(row["mttd_s"])
        row["mttr"] = duration_text(row["mttr_s"])
    charts = {
        "per_day": data["per_day"],
        "by_node": {
            "labels": [r["node"] for r in data["by_node"]],
            "per_1000": [r["per_1000_gpu_hours"] or 0 for r in data["by_node"]],
            "preemption_pct": [r["preemption_rate_pct"] or 0 for r in data["by_node"]],
        },
        "by_class": {
            "labels": [r["label"] for r in data["by_class"]],
            "mttd_min": [round((r["mttd_s"] or 0) / 60, 2) for r in data["by_class"]],
            "mttr_min": [round((r["mttr_s"] or 0) / 60, 2) for r in data["by_class"]],
        },
    }
    # A chart whose series hold no point (or only zeros) would be bare axes: say so instead.
    charts["per_day"]["has_data"] = any(any(s["counts"]) for s in charts["per_day"]["series"])
    charts["by_node"]["has_data"] = any(charts["by_node"]["per_1000"]) or any(
        charts["by_node"]["preemption_pct"]
    )
    charts["by_class"]["has_data"] = any(charts["by_class"]["mttd_min"]) or any(
        charts["by_class"]["mttr_min"]
    )
    return render(
        request,
        "incidents/ops_kpis.html",
        {
            "form": form,
            "days": days,
            "kpi": data,
            "harms": selectors.neighbour_harm_kpis(since=until - timedelta(days=days), until=until),
            "charts": charts,
            "periods": kpis.PERIODS,
            "nodes_hidden": nodes_hidden,
            "nodes_total": len(worst),
        },
    )


# --- ops: watchdog thresholds ------------------------------------------------------------------


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_watchdog(request: UserRequest) -> HttpResponse:
    row = selectors.thresholds()
    initial = {name: getattr(row, name) for name in ThresholdsForm().fields}
    form = ThresholdsForm(request.POST if request.method == "POST" else None, initial=initial)
    saved = submit(
        request, form, lambda _: services.thresholds_update(actor=request.user, **form.changes())
    )
    if saved.done:
        messages.success(request, "Watchdog thresholds saved; the next sample uses them.")
        return redirect("incidents:ops_watchdog")
    return render(
        request, "incidents/ops_watchdog.html", {"form": form, "row": row}, status=saved.status
    )


# --- tenant: incidents about their own slices -------------------------------------------------


def _tenant_incidents(request: MemberRequest, *, evidence: bool = False) -> QuerySet[Incident]:
    return selectors.incident_list(tenant=request.membership.tenant, evidence=evidence)


@member_required
@require_GET
def incident_list(request: MemberRequest) -> HttpResponse:
    page = paging.incident_page(_tenant_incidents(request), sort="last_seen", params=request.GET)
    tenant_id = request.membership.tenant.pk
    for incident in page:  # the template's words for each row, set on the row itself
        incident.plain = tenant_text(incident)  # type: ignore[attr-defined]
        incident.headline = tenant_title(incident)  # type: ignore[attr-defined]
        incident.your_slices = tenant_slices(incident, tenant_id)  # type: ignore[attr-defined]
    return render(request, "incidents/tenant_list.html", {"page": page})


@member_required
@require_GET
def incident_detail(request: MemberRequest, pk: int) -> HttpResponse:
    incident = get_object_or_404(_tenant_incidents(request, evidence=True), pk=pk)
    ev = incident.evidence if isinstance(incident.evidence, dict) else {}
    usage = None
    if isinstance(ev.get("used_mb"), int) and isinstance(ev.get("quota_mb"), int):
        usage = {"used_mb": ev["used_mb"], "quota_mb": ev["quota_mb"]}
    return render(
        request,
        "incidents/tenant_detail.html",
        {
            "incident": incident,
            "plain": tenant_text(incident),
            "headline": tenant_title(incident),
            "your_slices": tenant_slices(incident, request.membership.tenant.pk),
            "usage": usage,
        },
    )
