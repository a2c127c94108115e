"""Ops pages for the fleet (overview, node detail, registration) and /metrics."""

from __future__ import annotations

import hashlib
import hmac
import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.cache import cache
from django.core.paginator import Paginator
from django.db.models import Model
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.http import UserRequest
from gpuplatform.pages import is_partial, submit
from gpuplatform.querystring import is_id

from . import isolation, preflight, selectors, services, ssh, warning_line
from .forms import ApproveForm, DrainForm, NodeForm, NodePolicyForm, WatchdogOnlyForm
from .models import Gpu, Node

LIVE_SECONDS = 10
GPU_PAGE_SIZE = 50
ATTENTION_LIMIT = 12  # nodes named under the heatmap; the rest are counted and linked
# From this many nodes the cells shrink to small squares without their number (it stays
# in each cell's label and hover text): a thousand nodes fit a screen.
DENSE_FROM = 150
# How long the server remembers what a version of the heatmap held: a page that polls
# within it gets only the cells that changed, a page gone longer gets the whole heatmap.
SNAPSHOT_SECONDS = 600
_STATUS_LABELS = dict(Node.Status.choices)
_GATE_LABELS = dict(Node.GateStatus.choices)


def _show(row: Model, **values: object) -> None:
    """Set what a template shows beside a row's own fields (`gpu.heat`, `node.closed_reason`):
    values of this page, not columns."""
    for name, value in values.items():
        setattr(row, name, value)


def _heat(gpu: Gpu) -> int:
    if not gpu.vram_total_mb or gpu.last_memory_used_mb is None:
        return -1
    return round(100 * gpu.last_memory_used_mb / gpu.vram_total_mb)


def _node_closed_reason(node: Node | selectors.NodeRow) -> str:
    """Why no new slice lands on any GPU of this node, in words ("" when it takes them)."""
    if node.drained_at:
        return f"drained: {node.drain_reason}" if node.drain_reason else "drained by ops"
    if node.status != Node.Status.ACTIVE:
        reason = node.status_reason or node.last_error
        label = _STATUS_LABELS.get(node.status, node.status)
        return f"{label}: {reason}" if reason else label
    if node.gate_status != Node.GateStatus.PASSED:
        label = f"preflight {_GATE_LABELS.get(node.gate_status, node.gate_status)}"
        return f"{label}: {node.gate_reason}" if node.gate_reason else label
    return ""


def _gpu_closed_reason(gpu: Gpu) -> str:
    if gpu.accepting_placements:
        return ""
    return _not_accepting(gpu.not_accepting_reason)


def _not_accepting(reason: str | None) -> str:
    return f"not accepting placements: {reason}" if reason else "not accepting placements"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# What one node's cell shows, as a tuple: (pk, name, heat, mean, GPUs, GPUs with a sample,
# why the node takes no new slices, GPUs that take none themselves, allocated %). Equal
# tuples draw equal cells, so a refresh compares these and draws only what changed.
_Cell = tuple[int, str, int, int, int, int, str, int, int]


def _cell_html(cell: _Cell, node_url: str) -> str:
    pk, name, heat, mean, gpus, sampled, reason, closed, alloc = cell
    if not gpus:
        said = "no GPUs discovered"
    else:
        said = f"hottest GPU {heat}% VRAM used, mean {mean}%" if heat >= 0 else "no sample yet"
        said += f", {_plural(gpus, 'GPU')}"
        if sampled and sampled < gpus:
            said += f" ({gpus - sampled} without a sample)"
    if reason:
        said += f"; takes no new slices — {reason}"
    elif closed:
        said += f"; {closed} of {gpus} take no new slices"
    else:
        said += "; takes new slices"
    # An f-string over escaped text, not format_html: a thousand cells cost a thousand
    # of these, and format_html takes fifteen times as long (the numbers need no escaping).
    label = html.escape(f"{name}: {said}")
    return (
        f'<a id="node-cell-{pk}" class="heat-cell{" heat-off" if reason or closed else ""}"'
        f' href="{node_url.format(pk)}" hx-get="?node={pk}"'
        f' data-heat="{heat}" data-alloc="{alloc}"'  # colours: static/css/heat.css
        f' data-node="{html.escape(name)}" title="{label}" aria-label="{label}">'
        f"{f'{heat}%' if heat >= 0 else '—'}</a>"
    )


@dataclass
class _Heatmap:
    """The heatmap as a page holds it: a cell per node, the totals and the needs-attention
    list, and a version naming exactly that content."""

    cells: list[_Cell]
    digests: bytes  # 8 bytes a cell, in the order of `cells`
    totals: str
    attention: str
    version: str

    @property
    def pks(self) -> tuple[int, ...]:
        return tuple(cell[0] for cell in self.cells)

    def snapshot(self) -> tuple[tuple[int, ...], bytes, bytes, bytes]:
        return (self.pks, self.digests, _digest(self.totals), _digest(self.attention))

    def html(self, *, changed_since: bytes | None = None) -> list[str]:
        """The cells' HTML: all of them, or those whose digest differs from `changed_since`."""
        # reverse() once: every cell links to the same path with its own node's id
        node_url = reverse("nodes:node_detail", args=[0]).replace("/0/", "/{}/")
        return [
            _cell_html(cell, node_url)
            for k, cell in enumerate(self.cells)
            if changed_since is None
            or changed_since[8 * k : 8 * k + 8] != self.digests[8 * k : 8 * k + 8]
        ]


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


_Attention = tuple[tuple[int, int, str], selectors.NodeRow, str]


def _attention_item(row: selectors.NodeRow, heat: int, reason: str, line: str) -> _Attention | None:
    """(sort key, row, text) when the node needs ops' eyes, else None."""
    said = []
    if reason:
        said.append(f"No new slices on this node — {reason}")
    if row.hot:
        said.append(f"hottest GPU {heat}% VRAM used ({_plural(row.hot, 'GPU')} at or over {line}%)")
    if row.closed == 1:
        said.append(f"GPU {row.closed_index} — {_not_accepting(row.closed_reason)}")
    elif row.closed:
        said.append(f"{_plural(row.closed, 'GPU')} not accepting placements")
    if not said:
        return None
    rank = 0 if reason else 1 if row.hot else 2
    return (rank, -heat, row.name), row, "; ".join(said)


def _heatmap(warning_pct: float) -> _Heatmap:
    """The fleet as the heatmap draws it. A node costs a few small Python steps on one
    row of aggregates; its HTML is built only when a page needs that cell."""
    cells: list[_Cell] = []
    attention: list[_Attention] = []
    line = warning_line.pct_text(warning_pct)
    for row in selectors.fleet_nodes(warning_pct=warning_pct):
        heat = -1 if row.hottest_pct is None else round(row.hottest_pct)
        reason = _node_closed_reason(row)
        total = row.total_mb or 0
        cells.append(
            (
                row.pk,
                row.name,
                heat,
                round(row.mean_pct or 0),
                row.gpus,
                row.sampled,
                reason,
                row.closed,
                min(100, round(100 * (row.allocated_mb or 0) / total)) if total else 0,
            )
        )
        if item := _attention_item(row, heat, reason, line):
            attention.append(item)
    attention.sort(key=lambda item: item[0])
    totals = selectors.fleet_totals(warning_pct=warning_pct)
    totals["status_summary"] = ", ".join(
        f"{n} {status}" for status, n in totals["by_status"].items()
    )
    # (rendered without the request: no context processor, no query of theirs, per poll)
    totals_html = render_to_string(
        "nodes/_fleet_totals.html", {"totals": totals, "warning_pct": line}
    )
    attention_html = render_to_string(
        "nodes/_fleet_attention.html",
        {
            "attention": [(row, text) for _, row, text in attention[:ATTENTION_LIMIT]],
            "more": max(len(attention) - ATTENTION_LIMIT, 0),
            "totals": totals,
            "warning_pct": line,
        },
    )
    digests = b"".join(_digest(repr(cell)) for cell in cells)
    version = hashlib.blake2b(
        digests + _digest(totals_html) + _digest(attention_html), digest_size=12
    ).hexdigest()
    heatmap = _Heatmap(
        cells=cells,
        digests=digests,
        totals=totals_html,
        attention=attention_html,
        version=version,
    )
    # Kept for the polls to come, in Redis when it is configured (any web process answers
    # them), and kept longer while pages still hold it.
    if not cache.touch(_snapshot_key(version), SNAPSHOT_SECONDS):
        cache.set(_snapshot_key(version), heatmap.snapshot(), SNAPSHOT_SECONDS)
    return heatmap


def _snapshot_key(version: str) -> str:
    return f"nodes:fleet:heatmap:{version}"


def _heatmap_context(heatmap: _Heatmap) -> dict[str, object]:
    return {
        "cells": mark_safe("".join(heatmap.html())),  # noqa: S308 - its text escaped
        "dense": len(heatmap.cells) >= DENSE_FROM,
        "totals_html": heatmap.totals,
        "attention_html": heatmap.attention,
        "version": heatmap.version,
    }


def _changes(request: HttpRequest) -> HttpResponse:
    """What changed since the version the page holds: nothing (204, no body), the changed
    node cells and what else changed as out-of-band swaps, or the whole heatmap when
    the server no longer knows that version."""
    held = request.GET.get("v", "")
    heatmap = _heatmap(warning_line.warning_pct())
    if held == heatmap.version:
        return HttpResponse(status=204)
    snapshot = cache.get(_snapshot_key(held)) if held else None
    context: dict[str, object] = {"version": heatmap.version}
    if snapshot is None or snapshot[0] != heatmap.pks:  # unknown, or nodes came or went
        context.update(
            _heatmap_context(heatmap),
            full=True,
            totals_html=_oob(heatmap.totals),
            attention_html=_oob(heatmap.attention),
        )
    else:
        _, digests, totals, attention = snapshot
        context["changed"] = mark_safe(  # noqa: S308 - the cells' text escaped
            "".join(_oob(cell) for cell in heatmap.html(changed_since=digests))
        )
        if totals != _digest(heatmap.totals):
            context["totals_html"] = _oob(heatmap.totals)
        if attention != _digest(heatmap.attention):
            context["attention_html"] = _oob(heatmap.attention)
    # Out-of-band swaps only, rendered without the request (no context processor's query).
    return HttpResponse(render_to_string("nodes/_fleet_live.html", context))


def _oob(fragment: str) -> str:
    """`fragment` marked to be swapped in out of band: htmx replaces the element of its id."""
    return mark_safe(  # noqa: S308 - the fragment is markup this module built
        re.sub(r"^(\s*<[a-z]+)", r'\1 hx-swap-oob="true"', fragment, count=1)
    )


def _gpu_table(request: HttpRequest, warning_pct: float) -> dict[str, object]:
    """One page of the fleet's GPU table, as `filter`, `sort` and `page` ask."""
    line = warning_line.pct_text(warning_pct)
    filters = {key: words.format(pct=line) for key, words in selectors.GPU_FILTERS.items()}
    gpu_filter = request.GET.get("filter", "")
    gpu_filter = gpu_filter if gpu_filter in selectors.GPU_FILTERS else "all"
    gpu_sort = request.GET.get("sort", "")
    gpu_sort = gpu_sort if gpu_sort in selectors.GPU_SORTS else "hot"
    rows = selectors.fleet_gpu_rows(filter=gpu_filter, sort=gpu_sort, warning_pct=warning_pct)
    page = Paginator(rows, GPU_PAGE_SIZE).get_page(request.GET.get("page"))
    now = timezone.now()
    for gpu in page:
        _show(
            gpu,
            heat=_heat(gpu),
            age_s=(now - gpu.last_sample_at).total_seconds() if gpu.last_sample_at else None,
            closed_reason=_gpu_closed_reason(gpu),
            node_closed_reason=_node_closed_reason(gpu.node),
        )
    return {
        "page": page,
        "page_range": page.paginator.get_elided_page_range(page.number, on_each_side=2),
        "ellipsis": Paginator.ELLIPSIS,
        "gpu_filter": gpu_filter,
        "gpu_sort": gpu_sort,
        "gpu_filters": filters,
        "gpu_sorts": selectors.GPU_SORTS,
        "filter_words": filters[gpu_filter],
        "sort_words": selectors.GPU_SORTS[gpu_sort],
        "table_query": urlencode({"filter": gpu_filter, "sort": gpu_sort}),
        "live_seconds": LIVE_SECONDS,
    }


def _drill_context(pk: str) -> dict[str, object]:
    """One node's GPUs, drawn as cells (the heatmap's drill-down). Two queries."""
    node = get_object_or_404(selectors.node_list(), pk=pk)
    _show(node, closed_reason=_node_closed_reason(node))
    gpus = list(node.gpus.all())
    for gpu in gpus:
        _show(
            gpu,
            heat=_heat(gpu),
            closed_reason=_gpu_closed_reason(gpu),
            alloc_pct=(
                min(100, round(100 * (gpu.allocated_mb or 0) / gpu.vram_total_mb))
                if gpu.vram_total_mb
                else 0
            ),
        )
    return {"node": node, "gpus": gpus, "live_seconds": LIVE_SECONDS}


def _drill_or_none(pk: str) -> dict[str, object] | None:
    # The whole page with ?node= of a node gone is the page without its drill-down.
    try:
        return _drill_context(pk) if is_id(pk) else None
    except Http404:
        return None


@staff_member_required
@require_GET
def fleet(request: UserRequest) -> HttpResponse:
    """The fleet: totals, a heatmap of one cell per node with a drill-down to its GPUs,
    the nodes that need attention and a page of the GPU table. Its live parts ask the
    same URL: `?node=` for a node's GPUs, the table (htmx target `fleet-gpus`) for its
    current page, and otherwise for what changed since the version `v` the page holds."""
    node = request.GET.get("node", "")
    if is_partial(request):
        if is_id(node):
            return render(request, "nodes/_fleet_node.html", _drill_context(node))
        if request.htmx.target == "fleet-gpus":
            table = _gpu_table(request, warning_line.warning_pct())
            return render(request, "nodes/_fleet_gpus.html", table)
        return _changes(request)
    line = warning_line.warning_pct()
    context = {
        **_heatmap_context(_heatmap(line)),
        **_gpu_table(request, line),
        "drill": _drill_or_none(node),
        "warning_pct": warning_line.pct_text(line),
    }
    return render(request, "nodes/fleet.html", context)


def _isolation_rows(node: Node, gpus: list[Gpu]) -> list[tuple[str, str]]:
    """(cards, what isolates slices there): one row when every card has the same."""
    library = str((node.capabilities or {}).get("vram_quota_library") or "")
    proven = preflight.proven_models((node.preflight or {}).get("quota") or {})
    words = [
        isolation.card_isolation(
            mig_enabled=g.mig_enabled,
            mig_instances=len(g.mig_devices or []),
            model=g.model,
            whole_card_only=g.whole_card_only,
            quota_library=library,
            proven_models=proven,
            watchdog_only=node.watchdog_only_accepted_at is not None,
        )
        for g in gpus
    ]
    if len(set(words)) == 1:
        return [("every card", words[0])]
    return [(f"GPU {g.index}", text) for g, text in zip(gpus, words, strict=True)]


def _node_context(node: Node) -> dict[str, object]:
    gpus = list(node.gpus.all())
    processes = selectors.latest_processes(gpu_ids=[g.pk for g in gpus])
    for gpu in gpus:
        _show(gpu, heat=_heat(gpu), processes=processes.get(gpu.pk, []))
    return {
        "isolation_rows": _isolation_rows(node, gpus) if gpus else [],
        "node": node,
        "gpus": gpus,
        "pending_fingerprint": ssh.fingerprint(node.pending_host_key)
        if node.pending_host_key
        else "",
        "live_seconds": LIVE_SECONDS,
        "drain_form": DrainForm(),
        "checks": (node.preflight or {}).get("checks") or [],
        "facts": (node.preflight or {}).get("facts") or {},
        "quota": (node.preflight or {}).get("quota") or {},
        "agent": selectors.node_agent(node_id=node.pk),
        "agent_entries": selectors.node_agent_entries(node_id=node.pk, limit=10),
    }


@staff_member_required
@require_GET
def node_detail(request: UserRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(
        selectors.node_list().select_related("watchdog_only_accepted_by"), pk=pk
    )
    template = "nodes/_node_live.html" if is_partial(request) else "nodes/node_detail.html"
    return render(request, template, _node_context(node))


@staff_member_required
def node_create(request: UserRequest) -> HttpResponse:
    form = NodeForm(request.POST or None)
    registered = submit(request, form, lambda data: services.node_register(**data))
    if registered.done:
        node = registered.result
        messages.success(
            request,
            f"{node.name} registered. "
            + (
                "Discovery started."
                if node.host_key
                else "Its host key is being read: approve the fingerprint below."
            ),
        )
        return redirect("nodes:node_detail", pk=node.pk)
    return render(request, "nodes/node_form.html", {"form": form})


def _drain(request: UserRequest, node: Node) -> str:
    form = DrainForm(request.POST)
    services.node_drain(node=node, reason=form.cleaned_data["reason"] if form.is_valid() else "")
    return f"{node.name} is draining: no new placements."


def _undrain(request: UserRequest, node: Node) -> str:
    services.node_undrain(node=node)
    return f"{node.name} accepts placements again."


def _approve(request: UserRequest, node: Node) -> str:
    form = ApproveForm(request.POST)
    fingerprint = form.cleaned_data["fingerprint"] if form.is_valid() else ""
    services.node_approve_host_key(node=node, fingerprint=fingerprint, actor=request.user)
    return f"Host key {fingerprint} pinned for {node.name}; discovery started."


def _rescan(request: UserRequest, node: Node) -> str:
    services.node_rescan(node=node)
    return "Reading the node's host key again; approve it when it appears."


def _preflight(request: UserRequest, node: Node) -> str:
    services.node_preflight_request(node=node)
    return f"Preflight of {node.name} started: the verdict appears here in a few seconds."


def _watchdog(request: UserRequest, node: Node) -> str:
    form = WatchdogOnlyForm(request.POST)
    if not form.is_valid():
        raise ServiceError("Say why (it is kept in the policy's history).")
    accept = bool(form.cleaned_data["accept"])
    services.node_accept_watchdog_only(
        node=node, actor=request.user, accept=accept, reason=form.cleaned_data["reason"]
    )
    if accept:
        return f"{node.name}: GPUs without a proven quota are sold in slices, held by the watchdog."
    return f"{node.name}: GPUs without a proven quota are sold whole only again."


NODE_ACTIONS: dict[str, Callable[[UserRequest, Node], str]] = {
    "drain": _drain,
    "undrain": _undrain,
    "approve": _approve,
    "rescan": _rescan,
    "preflight": _preflight,
    "watchdog": _watchdog,
}


@staff_member_required
@require_POST
def node_action(request: UserRequest, pk: int, action: str) -> HttpResponse:
    """The node page's buttons: one service call each, then back to the page."""
    node = get_object_or_404(Node, pk=pk)
    try:
        messages.success(request, NODE_ACTIONS[action](request, node))
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect("nodes:node_detail", pk=node.pk)


# --- placement policy: overcommit ratio and accepting placements, per GPU ----------------

POLICY_PAGE_SIZE = 50


class RatioForm(forms.Form):
    # The range and the recommended bound are the service's rules; it says why it refuses.
    overcommit_ratio = forms.DecimalField(max_digits=5, decimal_places=2)


class AcceptingForm(forms.Form):
    accepting = forms.TypedChoiceField(choices=[("1", "allow"), ("0", "stop")], coerce=int)
    reason = forms.CharField(max_length=500, required=False)


@staff_member_required
@require_GET
def policy(request: UserRequest) -> HttpResponse:
    gpus = selectors.gpu_list().filter(present=True)
    page = Paginator(gpus, POLICY_PAGE_SIZE).get_page(request.GET.get("page"))
    windows = selectors.rollup_windows(gpu_ids=[g.pk for g in page])  # one query per page
    interruptible = selectors.interruptible_counts(gpu_ids=[g.pk for g in page])
    for gpu in page:
        _show(
            gpu,
            recommended=selectors.gpu_recommended_ratio(gpu=gpu, window=windows.get(gpu.pk)),
            allocatable_mb=gpu.capacity_mb,  # what placement sells
            interruptible=interruptible[gpu.pk],
        )
    return render(request, "nodes/policy.html", {"page": page})


def _back_to_policy(request: HttpRequest, gpu: Gpu) -> HttpResponseRedirect:
    page = request.POST.get("page", "")
    query = f"?page={page}" if page.isdigit() else ""
    return redirect(f"{reverse('nodes:policy')}{query}#gpu-{gpu.pk}")


@staff_member_required
@require_POST
def policy_ratio(request: UserRequest, pk: int) -> HttpResponse:
    gpu = get_object_or_404(Gpu.objects.select_related("node"), pk=pk)
    form = RatioForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{gpu.label}: enter a ratio such as 1.25.")
        return _back_to_policy(request, gpu)
    try:
        gpu = services.gpu_set_overcommit(gpu=gpu, ratio=form.cleaned_data["overcommit_ratio"])
    except ServiceError as exc:
        messages.error(request, f"{gpu.label}: {exc.message}")
    else:
        messages.success(request, f"{gpu.label}: overcommit ratio set to {gpu.overcommit_ratio}.")
    return _back_to_policy(request, gpu)


@staff_member_required
@require_POST
def policy_accepting(request: UserRequest, pk: int) -> HttpResponse:
    gpu = get_object_or_404(Gpu.objects.select_related("node"), pk=pk)
    form = AcceptingForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{gpu.label}: choose allow or stop.")
        return _back_to_policy(request, gpu)
    accepting = bool(form.cleaned_data["accepting"])
    try:
        services.gpu_set_accepting(gpu=gpu, accepting=accepting, reason=form.cleaned_data["reason"])
    except ServiceError as exc:
        messages.error(request, f"{gpu.label}: {exc.message}")
    else:
        messages.success(
            request,
            f"{gpu.label} accepts placements again."
            if accepting
            else f"{gpu.label} takes no new placements; running slices continue.",
        )
    return _back_to_policy(request, gpu)


# --- Prometheus ---------------------------------------------------------------------------


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Per-GPU gauges in the style of NVIDIA's DCGM exporter, for Prometheus/Grafana.

    Protected by `Authorization: Bearer <GPUPLATFORM_METRICS_TOKEN>`; off when unset."""
    token = settings.METRICS_TOKEN
    if not token:
        return HttpResponse(
            "metrics are disabled: set GPUPLATFORM_METRICS_TOKEN\n",
            status=404,
            content_type="text/plain",
        )
    header = request.headers.get("Authorization", "")
    presented = header[7:].strip().encode("utf-8", "surrogateescape")
    if not (header.startswith("Bearer ") and hmac.compare_digest(presented, token.encode())):
        response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(
        selectors.metrics_text(now=timezone.now()),
        content_type="text/plain; version=0.0.4; charset=utf-8",
    )


# --- the preflight gate's policy ------------------------------------------------------------

POLICY_HISTORY_PAGE_SIZE = 25


@staff_member_required
def node_policy(request: UserRequest) -> HttpResponse:
    """What a node must have to take placements; every change needs a reason and is kept."""
    policy = selectors.preflight_policy()
    form = NodePolicyForm(request.POST or None, initial=NodePolicyForm.initial_from(policy))
    saved = submit(
        request,
        form,
        lambda data: services.preflight_policy_update(actor=request.user, **data),
    )
    if saved.done:
        messages.success(request, "Node policy saved; every node is being judged again.")
        return redirect("nodes:node_policy")
    history = Paginator(selectors.node_policy_changes(), POLICY_HISTORY_PAGE_SIZE)
    return render(
        request,
        "nodes/node_policy.html",
        {
            "form": form,
            "policy": policy,
            "history": history.get_page(request.GET.get("page")),
            "reserved": isolation.reserved_list(),
        },
    )
