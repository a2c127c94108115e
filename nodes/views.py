"""Ops pages for the fleet (overview, node detail, registration) and /metrics."""

from __future__ import annotations

import hmac

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.pages import is_partial, submit

from . import isolation, selectors, services, ssh
from .forms import ApproveForm, DrainForm, NodeForm, NodePolicyForm, WatchdogOnlyForm
from .models import Gpu, Node

LIVE_SECONDS = 10


def _heat(gpu) -> int:  # type: ignore[no-untyped-def]
    if not gpu.vram_total_mb or gpu.last_memory_used_mb is None:
        return -1
    return round(100 * gpu.last_memory_used_mb / gpu.vram_total_mb)


def _node_closed_reason(node: Node) -> str:
    """Why no new slice lands on any GPU of this node, in words ("" when it takes them)."""
    if node.drained_at:
        return f"drained: {node.drain_reason}" if node.drain_reason else "drained by ops"
    if node.status != Node.Status.ACTIVE:
        reason = node.status_reason or node.last_error
        return f"{node.get_status_display()}: {reason}" if reason else node.get_status_display()
    if node.gate_status != Node.GateStatus.PASSED:
        label = f"preflight {node.get_gate_status_display()}"
        return f"{label}: {node.gate_reason}" if node.gate_reason else label
    return ""


def _gpu_closed_reason(gpu: Gpu) -> str:
    if gpu.accepting_placements:
        return ""
    reason = gpu.not_accepting_reason
    return f"not accepting placements: {reason}" if reason else "not accepting placements"


@staff_member_required
@require_GET
def fleet(request: HttpRequest) -> HttpResponse:
    nodes = list(selectors.node_list())
    now = timezone.now()
    for node in nodes:
        node.closed_reason = _node_closed_reason(node)
        for gpu in node.gpus.all():
            gpu.heat = _heat(gpu)
            gpu.age_s = (now - gpu.last_sample_at).total_seconds() if gpu.last_sample_at else None
            gpu.closed_reason = _gpu_closed_reason(gpu)
            gpu.alloc_pct = (
                min(100, round(100 * (gpu.allocated_mb or 0) / gpu.vram_total_mb))
                if gpu.vram_total_mb
                else 0
            )
    context = {
        "nodes": nodes,
        "totals": selectors.fleet_totals(nodes),
        "live_seconds": LIVE_SECONDS,
    }
    template = "nodes/_fleet_live.html" if is_partial(request) else "nodes/fleet.html"
    return render(request, template, context)


def _node_context(node: Node) -> dict:
    node = selectors.node_list().get(pk=node.pk)
    gpus = list(node.gpus.all())
    processes = selectors.latest_processes(gpu_ids=[g.pk for g in gpus])
    for gpu in gpus:
        gpu.heat = _heat(gpu)
        gpu.processes = processes.get(gpu.pk, [])
    return {
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
    }


@staff_member_required
@require_GET
def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(Node, pk=pk)
    template = "nodes/_node_live.html" if is_partial(request) else "nodes/node_detail.html"
    return render(request, template, _node_context(node))


@staff_member_required
def node_create(request: HttpRequest) -> HttpResponse:
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


def _drain(request: HttpRequest, node: Node) -> str:
    form = DrainForm(request.POST)
    services.node_drain(node=node, reason=form.cleaned_data["reason"] if form.is_valid() else "")
    return f"{node.name} is draining: no new placements."


def _undrain(request: HttpRequest, node: Node) -> str:
    services.node_undrain(node=node)
    return f"{node.name} accepts placements again."


def _approve(request: HttpRequest, node: Node) -> str:
    form = ApproveForm(request.POST)
    fingerprint = form.cleaned_data["fingerprint"] if form.is_valid() else ""
    services.node_approve_host_key(node=node, fingerprint=fingerprint, actor=request.user)
    return f"Host key {fingerprint} pinned for {node.name}; discovery started."


def _rescan(request: HttpRequest, node: Node) -> str:
    services.node_rescan(node=node)
    return "Reading the node's host key again; approve it when it appears."


def _preflight(request: HttpRequest, node: Node) -> str:
    services.node_preflight_request(node=node)
    return f"Preflight of {node.name} started: the verdict appears here in a few seconds."


def _watchdog(request: HttpRequest, node: Node) -> str:
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


NODE_ACTIONS = {
    "drain": _drain,
    "undrain": _undrain,
    "approve": _approve,
    "rescan": _rescan,
    "preflight": _preflight,
    "watchdog": _watchdog,
}


@staff_member_required
@require_POST
def node_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
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
def policy(request: HttpRequest) -> HttpResponse:
    gpus = selectors.gpu_list().filter(present=True)
    page = Paginator(gpus, POLICY_PAGE_SIZE).get_page(request.GET.get("page"))
    windows = services.rollup_windows(gpu_ids=[g.pk for g in page])  # one query per page
    interruptible = selectors.interruptible_counts(gpu_ids=[g.pk for g in page])
    for gpu in page:
        gpu.recommended = services.gpu_recommended_ratio(gpu=gpu, window=windows.get(gpu.pk))
        gpu.allocatable_mb = int(gpu.vram_total_mb * gpu.overcommit_ratio)
        gpu.interruptible = interruptible[gpu.pk]
    return render(request, "nodes/policy.html", {"page": page})


def _back_to_policy(request: HttpRequest, gpu: Gpu) -> HttpResponse:
    page = request.POST.get("page", "")
    query = f"?page={page}" if page.isdigit() else ""
    return redirect(f"{reverse('nodes:policy')}{query}#gpu-{gpu.pk}")


def _gpu_name(gpu: Gpu) -> str:
    return f"{gpu.node.name} GPU {gpu.index}"


@staff_member_required
@require_POST
def policy_ratio(request: HttpRequest, pk: int) -> HttpResponse:
    gpu = get_object_or_404(Gpu.objects.select_related("node"), pk=pk)
    form = RatioForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{_gpu_name(gpu)}: enter a ratio such as 1.25.")
        return _back_to_policy(request, gpu)
    try:
        gpu = services.gpu_set_overcommit(gpu=gpu, ratio=form.cleaned_data["overcommit_ratio"])
    except ServiceError as exc:
        messages.error(request, f"{_gpu_name(gpu)}: {exc.message}")
    else:
        messages.success(
            request, f"{_gpu_name(gpu)}: overcommit ratio set to {gpu.overcommit_ratio}."
        )
    return _back_to_policy(request, gpu)


@staff_member_required
@require_POST
def policy_accepting(request: HttpRequest, pk: int) -> HttpResponse:
    gpu = get_object_or_404(Gpu.objects.select_related("node"), pk=pk)
    form = AcceptingForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"{_gpu_name(gpu)}: choose allow or stop.")
        return _back_to_policy(request, gpu)
    accepting = bool(form.cleaned_data["accepting"])
    try:
        services.gpu_set_accepting(gpu=gpu, accepting=accepting, reason=form.cleaned_data["reason"])
    except ServiceError as exc:
        messages.error(request, f"{_gpu_name(gpu)}: {exc.message}")
    else:
        messages.success(
            request,
            f"{_gpu_name(gpu)} accepts placements again."
            if accepting
            else f"{_gpu_name(gpu)} takes no new placements; running slices continue.",
        )
    return _back_to_policy(request, gpu)


# --- Prometheus ---------------------------------------------------------------------------


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


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
    now = timezone.now()
    families = {
        "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
        "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
        "DCGM_FI_DEV_FB_TOTAL": ("gauge", "Framebuffer memory total (in MiB)."),
        "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
        "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
        "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
        "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
        "gpuplatform_gpu_allocated_mib": ("gauge", "VRAM reserved by slices (in MiB)."),
        "gpuplatform_gpu_sample_age_seconds": ("gauge", "Seconds since the last sample."),
        "gpuplatform_gpu_accepting_placements": ("gauge", "1 if new slices may land here."),
    }
    lines: dict[str, list[str]] = {name: [] for name in families}
    node_lines = []
    for node in selectors.node_list():
        for status in Node.Status.values:
            node_lines.append(
                f'gpuplatform_node_status{{Hostname="{_label(node.name)}",status="{status}"}} '
                f"{1 if node.status == status else 0}"
            )
        for gpu in node.gpus.all():
            labels = (
                f'gpu="{gpu.index}",UUID="{_label(gpu.uuid)}",modelName="{_label(gpu.model)}",'
                f'Hostname="{_label(node.name)}"'
            )
            values = {
                "DCGM_FI_DEV_FB_TOTAL": gpu.vram_total_mb,
                "gpuplatform_gpu_allocated_mib": gpu.allocated_mb or 0,
                "gpuplatform_gpu_accepting_placements": int(gpu.accepting_placements),
            }
            if gpu.last_sample_at:
                used = gpu.last_memory_used_mb or 0
                values.update(
                    {
                        "DCGM_FI_DEV_FB_USED": used,
                        "DCGM_FI_DEV_FB_FREE": max(gpu.vram_total_mb - used, 0),
                        "DCGM_FI_DEV_GPU_UTIL": gpu.last_utilization_gpu,
                        "DCGM_FI_DEV_MEM_COPY_UTIL": gpu.last_utilization_memory,
                        "DCGM_FI_DEV_GPU_TEMP": gpu.last_temperature_c,
                        "DCGM_FI_DEV_POWER_USAGE": gpu.last_power_w,
                        "gpuplatform_gpu_sample_age_seconds": round(
                            (now - gpu.last_sample_at).total_seconds(), 1
                        ),
                    }
                )
            for name, value in values.items():
                if value is not None:
                    lines[name].append(f"{name}{{{labels}}} {value}")
    out = []
    for name, (kind, help_text) in families.items():
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines[name]]
    out += [
        "# HELP gpuplatform_node_status 1 for the node's current status.",
        "# TYPE gpuplatform_node_status gauge",
        *node_lines,
    ]
    return HttpResponse(
        "\n".join(out) + "\n", content_type="text/plain; version=0.0.4; charset=utf-8"
    )


# --- the preflight gate's policy ------------------------------------------------------------

POLICY_HISTORY_PAGE_SIZE = 25


@staff_member_required
def node_policy(request: HttpRequest) -> HttpResponse:
    """What a node must have to take placements; every change needs a reason and is kept."""
    policy = services.node_policy()
    form = NodePolicyForm(request.POST or None, initial=NodePolicyForm.initial_from(policy))
    saved = submit(
        request,
        form,
        lambda data: services.node_policy_update(actor=request.user, **data),
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
