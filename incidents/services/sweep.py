"""The watchdog's minute sweep: the rules that need a window of samples or the fleet's
state (fleet pressure, orphans, slow leaks, idle slices, OOM exits, nodes' gate and reach).

Findings go through the same `findings_apply` as the per-batch rules; rules with no
"back to normal" reading close once they have been quiet for a while.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from nodes.devices import allocation_quota, vram_quota
from nodes.models import Allocation, GateStatus, Gpu, GpuSample, Node, ProcessSample
from tenants.models import Slice

from .. import rules
from ..locks import incident_lock
from ..models import GpuWatch, Incident, Thresholds
from ..selectors import live_slices
from .ledger import incident_resolve_locked
from .watchdog import findings_apply, slice_watches_ensure


def watch_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Windowed rules: the fleet sweep, slow leaks, idle slices; OOM exits reconcile
    found; unreachable nodes."""
    now = now or timezone.now()
    th = Thresholds.current().as_rules()
    findings: list[rules.Finding] = []
    gpus = {g.pk: g for g in Gpu.objects.filter(present=True).select_related("node")}
    since = now - timedelta(seconds=th.sweep_window_s)
    series: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for gpu_id, t, used in (
        GpuSample.objects.filter(taken_at__gte=since, taken_at__lte=now)
        .order_by("taken_at")
        .values_list("gpu_id", "taken_at", "memory_used_mb")
    ):
        series[gpu_id].append((t.timestamp(), used))
    quotas = _container_quotas(list(series), since)
    held: dict[tuple[int, float, str], int] = defaultdict(int)
    for gpu_id, t, container, used in ProcessSample.objects.filter(
        gpu_id__in=list(series), container_id__in=list(quotas), taken_at__gte=since
    ).values_list("gpu_id", "taken_at", "container_id", "used_memory_mb"):
        held[gpu_id, t.timestamp(), container] += used
    in_quota: dict[int, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for (gpu_id, at, container), used in held.items():
        in_quota[gpu_id][at] += min(used, quotas[container])
    for gpu_id, points in series.items():
        gpu = gpus.get(gpu_id)
        if gpu is None:
            continue
        view = rules.GpuView(
            gpu_id=gpu.pk,
            node_id=gpu.node_id,
            uuid=gpu.uuid,
            total_mb=gpu.vram_total_mb,
            used_mb=points[-1][1],
        )
        findings += rules.fleet_sweep(view, points, th, in_quota=in_quota.get(gpu_id))
    findings += _sweep_orphans(gpus, th)
    findings += _sweep_slices(now, th)
    findings += _sweep_oom(now)
    findings += _sweep_nodes()
    counts = findings_apply(findings=findings, now=now, gpus=gpus)
    counts["expired"] = _expire_quiet(now)
    return counts


def _container_quotas(gpu_ids: list[int], since: datetime) -> dict[str, int]:
    """What each container on these cards may hold within its own quota (its slice's tier,
    or its MIG instance's memory: vram_quota), for the memory the card's slices held."""
    return {
        cid: vram_quota(tier_mb=tier, mig_device_uuid=mig, mig_devices=devices).mb
        for cid, tier, mig, devices in Allocation.objects.filter(gpu_id__in=gpu_ids)
        .exclude(container_id="")
        .filter(Q(released_at__isnull=True) | Q(released_at__gte=since))
        .values_list("container_id", "vram_mb", "mig_device_uuid", "gpu__mig_devices")
    }


# Rules whose condition has no clear "back to normal" reading: their incident closes
# once it has not been seen for this long (a recurrence later opens a new one).
QUIET_RULES = ("process_jump", "slow_leak", "orphan_process", "unattributed_memory")
QUIET_AFTER = timedelta(minutes=30)


def _expire_quiet(now: datetime) -> int:
    done = 0
    stale = Incident.objects.open().filter(rule__in=QUIET_RULES, last_seen_at__lt=now - QUIET_AFTER)
    for pk in stale.values_list("pk", flat=True):
        with transaction.atomic():
            incident = incident_lock(pk)
            if incident.status == Incident.Status.RESOLVED:
                continue
            minutes = int(QUIET_AFTER.total_seconds() // 60)
            incident_resolve_locked(
                incident=incident, actor=None, note=f"Not seen for {minutes} minutes.", now=now
            )
            done += 1
    return done


def _sweep_orphans(gpus: dict[int, Gpu], th: rules.Thresholds) -> list[rules.Finding]:
    """Reclaim failures on each card's latest sample: memory held by processes of no
    slice, or used with no process. Not urgent like a breach, so once a minute; an
    orphan seen on `orphan_confirm_samples` sweeps in a row is ended."""
    out: list[rules.Finding] = []
    latest = list(
        ProcessSample.objects.filter(
            gpu_id__in=list(gpus), taken_at=F("gpu__last_sample_at")
        ).values_list("gpu_id", "pid", "used_memory_mb", "container_id")
    )
    procs: dict[int, list[rules.ProcessView]] = defaultdict(list)
    for gpu_id, pid, used, cid in latest:
        procs[gpu_id].append(
            rules.ProcessView(gpu_id=gpu_id, pid=pid, used_mb=used, container_id=cid)
        )
    running, known = live_slices()
    slice_watches_ensure(slice_ids=[r["pk"] for r in running])  # as on each batch
    # A card's latest sample may be older than a slice's end: its processes were the
    # slice's when the sample was taken. Judge each sample against the slices live then.
    ended, lasts = _slices_of({cid for _, _, _, cid in latest if cid and cid not in known})
    watches = {w.gpu_id: w for w in GpuWatch.objects.filter(gpu_id__in=list(gpus))}
    for gpu in gpus.values():
        found = _orphans_on(gpu, watches.get(gpu.pk), procs[gpu.pk], known, ended, th)
        # An orphan is an incident once it is confirmed, not at the first sight: memory
        # being freed as its container goes is no orphan.
        out += [
            _where_orphan(f, gpu, lasts)
            for f in found
            if f.rule != "orphan_process" or f.evidence["seen"] >= th.orphan_confirm_samples
        ]
    return out


def _slices_of(
    containers: set[str],
) -> tuple[dict[str, datetime], dict[str, tuple[int, int]]]:
    """Of containers no live slice owns: when the slice each belonged to ended, and that
    slice's (id, tenant id), the last one where several had it."""
    ended: dict[str, datetime] = {}
    lasts: dict[str, tuple[int, int]] = {}
    for cid, stopped, pk, tenant_id in (
        Slice.objects.filter(container_id__in=containers)
        .order_by("pk")
        .values_list("container_id", "stopped_at", "pk", "tenant_id")
        if containers
        else []
    ):
        lasts[cid] = (pk, tenant_id)
        if stopped is not None:
            ended[cid] = stopped
    return ended, lasts


def _orphans_on(
    gpu: Gpu,
    watch: GpuWatch | None,
    procs: list[rules.ProcessView],
    known: set[str],
    ended: dict[str, datetime],
    th: rules.Thresholds,
) -> list[rules.Finding]:
    """The orphans on the card's latest sample, judged once per sample (the streaks are
    remembered on its watch). Only a live node's cards sampled through NVML are judged."""
    if gpu.last_memory_used_mb is None or gpu.node.status != Node.Status.ACTIVE:
        return []
    if gpu.node.sample_source != "nvml":
        return []  # nvidia-smi names no container: every process would look orphaned
    view = rules.GpuView(
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
        uuid=gpu.uuid,
        total_mb=gpu.vram_total_mb,
        used_mb=gpu.last_memory_used_mb,
    )
    memory = (watch.orphan_streaks if watch else {}) or {}
    sample_at = gpu.last_sample_at.isoformat() if gpu.last_sample_at else ""
    if memory.get("at") == sample_at:
        return []  # no new sample since the last sweep: nothing new to count
    streaks = {(gpu.pk, int(pid)): n for pid, n in (memory.get("pids") or {}).items()}
    taken = gpu.last_sample_at
    live_then = known | {cid for cid, at in ended.items() if taken and at >= taken}
    found = rules.orphans(view, procs, live_then, th, streaks=streaks)
    _remember_orphans(gpu, watch, found, sample_at)
    return found


def _remember_orphans(
    gpu: Gpu, watch: GpuWatch | None, findings: list[rules.Finding], sample_at: str
) -> None:
    """Orphans counted on this sample (a streak grows once per new sample)."""
    seen = {
        str(f.evidence["pid"]): f.evidence["seen"] for f in findings if f.rule == "orphan_process"
    }
    if watch is None:  # remembered even with nothing found: one sample is judged once
        watch = GpuWatch.objects.get_or_create(gpu=gpu)[0]
    memory = {"at": sample_at, "pids": seen}
    if watch.orphan_streaks != memory:
        watch.orphan_streaks = memory
        watch.save(update_fields=["orphan_streaks"])


def _where_orphan(f: rules.Finding, gpu: Gpu, lasts: dict[str, tuple[int, int]]) -> rules.Finding:
    """A confirmed orphan names the node, the GPU, the PID and, where the node can tell
    (the process's cgroup names a container), the container and the slice it last
    belonged to."""
    if f.rule != "orphan_process":
        return f
    cid = f.evidence.get("container_id") or ""
    last = lasts.get(cid)
    where = f"node {gpu.label}"
    title = f"Process {f.evidence['pid']} on {where} holds {f.evidence['used_mb']} MiB"
    title += f" and belongs to no slice (last: slice {last[0]})" if last else " of no slice"
    evidence = {**f.evidence, "node": gpu.node.name, "gpu_index": gpu.index}
    if cid:
        evidence["container"] = cid[:12]
    if last:
        evidence["last_slice"], evidence["last_tenant_id"] = last
    return dataclasses.replace(f, title=title, evidence=evidence)


def _judged_slices(
    now: datetime, *, slice_ids: list[int] | None = None
) -> list[tuple[Slice, rules.SliceView]]:
    """The running slices (of `slice_ids`, when given) whose node sends fresh telemetry:
    only those can be judged idle or leaking."""
    running = Slice.objects.filter(state=Slice.State.RUNNING).exclude(container_id="")
    if slice_ids is not None:
        running = running.filter(pk__in=slice_ids)
    fresh_after = now - timedelta(seconds=3 * settings.NODES_SAMPLE_INTERVAL)
    out = []
    for s in running.select_related("allocation__gpu__node", "watch"):
        gpu = s.allocation.gpu  # type: ignore[union-attr]
        if gpu.node.status not in (Node.Status.ACTIVE, Node.Status.DRAINING):
            continue  # no telemetry from it
        if gpu.last_sample_at is None or gpu.last_sample_at < fresh_after:
            continue
        view = rules.SliceView(
            slice_id=s.pk,
            tenant_id=s.tenant_id,
            gpu_id=gpu.pk,
            node_id=gpu.node_id,
            container_id=s.container_id,
            quota_mb=allocation_quota(s.allocation, tier_mb=s.vram_mb).mb,
        )
        out.append((s, view))
    return out


def _idle(
    s: Slice, view: rules.SliceView, now: datetime, th: rules.Thresholds
) -> list[rules.Finding]:
    watch = getattr(s, "watch", None)
    last_active = (watch.last_active_at if watch else None) or s.started_at
    idle_for = (now - last_active).total_seconds() if last_active else None
    warned = watch.idle_warned_at if watch else None
    warned_for = (now - warned).total_seconds() if warned else None
    return rules.idle(
        view, idle_for_s=idle_for, warned_for_s=warned_for, th=th, now_epoch=now.timestamp()
    )


def _sweep_slices(now: datetime, th: rules.Thresholds) -> list[rules.Finding]:
    """Slow leaks and idleness of running slices."""
    out: list[rules.Finding] = []
    judged = _judged_slices(now)
    if not judged:
        return out
    since = now - timedelta(seconds=th.leak_window_s)
    sums: dict[str, dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    for cid, t, used in ProcessSample.objects.filter(
        container_id__in=[s.container_id for s, _ in judged], taken_at__gte=since
    ).values_list("container_id", "taken_at", "used_memory_mb"):
        sums[cid][t] += used
    for s, view in judged:
        points = sorted((t.timestamp(), mb) for t, mb in sums[s.container_id].items())
        out += rules.slow_leak(view, points, th)
        out += _idle(s, view, now, th)
    return out


def slice_idle_judge(*, slice_id: int, now: datetime | None = None) -> dict[str, int]:
    """The idle stop a warning scheduled for its due time: judged again now, on fresh
    telemetry (a slice that computed since the warning is left alone), so the stop comes
    when it is due, not at the next minute's sweep."""
    now = now or timezone.now()
    th = Thresholds.current().as_rules()
    findings = [
        f for s, view in _judged_slices(now, slice_ids=[slice_id]) for f in _idle(s, view, now, th)
    ]
    return findings_apply(findings=findings, now=now) if findings else {}


OOM_LOOKBACK = timedelta(minutes=30)


def _sweep_oom(now: datetime) -> list[rules.Finding]:
    """A container that exited out of memory (exit 137, OOM-killed, CUDA OOM in its
    log): reconcile recorded it on the slice; here it becomes an OOM incident."""
    failed = (
        Slice.objects.filter(state=Slice.State.FAILED, stopped_at__gte=now - OOM_LOOKBACK)
        .filter(
            Q(exit_code=137)
            | Q(state_reason__icontains="out of memory")
            | Q(state_reason__icontains="out of GPU memory")
        )
        .select_related("allocation__gpu")
    )
    out = []
    for s in failed:
        gpu = s.allocation.gpu if s.allocation else None
        out.append(
            rules.Finding(
                rule="oom_exit",
                target=f"slice:{s.pk}",
                severity=rules.WARNING,
                root_cause=rules.APP_PARAMETERS,
                title=f"Slice {s.pk} ended out of memory",
                detail=s.state_reason[:300],
                gpu_id=gpu.pk if gpu else None,
                node_id=gpu.node_id if gpu else None,
                slice_id=s.pk,
                tenant_id=s.tenant_id,
                evidence={"exit_code": s.exit_code, "reason": s.state_reason[:300]},
            )
        )
    return [
        f for f in out if not Incident.objects.filter(rule=f.rule, target_key=f.target).exists()
    ]


# The probes' quota verdicts that open `quota_not_effective`: a probe got past the quota,
# plainly or by setting its own environment inside the container.
NOT_EFFECTIVE = ("ineffective", "environment")


def _sweep_gate() -> list[rules.Finding]:
    """The preflight gate's verdicts: a failed node is an incident until it passes again;
    a quota library a probe got past is one until the probes prove it again."""
    out = []
    for pk, name, reason in Node.objects.filter(gate_status=GateStatus.FAILED).values_list(
        "pk", "name", "gate_reason"
    ):
        out.append(rules.gate_failed(pk, name, reason))
    ineffective = set()
    for pk, name, checked in Node.objects.filter(gate_status=GateStatus.PASSED).values_list(
        "pk", "name", "preflight"
    ):
        quota = ((checked or {}).get("quota") or {}).items()
        models = sorted(m for m, state in quota if state in NOT_EFFECTIVE)
        if models:
            ineffective.add(pk)
            by_environment = all(s == "environment" for m, s in quota if m in models)
            out.append(rules.quota_not_effective(pk, name, models, by_environment=by_environment))
    open_ones = Incident.objects.filter(
        rule__in=["node_gate_failed", "quota_not_effective"], resolved_at__isnull=True
    ).values_list("rule", "node_id", "node__name", "node__gate_status")
    for rule, node_id, name, status in open_ones:
        if node_id is None:
            continue
        cleared = (
            status == GateStatus.PASSED
            if rule == "node_gate_failed"
            else node_id not in ineffective and status == GateStatus.PASSED
        )
        if cleared:
            out.append(
                rules.Finding(
                    rule=rule,
                    target=f"node:{name}",
                    severity=rules.WARNING,
                    root_cause=rules.NO_ISOLATION,
                    title=f"Node {name} passes its preflight again",
                    node_id=node_id,
                    resolves=True,
                )
            )
    return out


def _sweep_nodes() -> list[rules.Finding]:
    out = _sweep_gate()
    for node in Node.objects.filter(status=Node.Status.UNREACHABLE):
        out.append(rules.unreachable(node.pk, node.name, node.status_reason))
    for node in (
        Node.objects.filter(status__in=[Node.Status.ACTIVE, Node.Status.DRAINING])
        .filter(incidents__rule="node_unreachable", incidents__resolved_at__isnull=True)
        .distinct()
    ):
        f = rules.unreachable(node.pk, node.name, "")
        out.append(
            rules.Finding(
                rule=f.rule,
                target=f.target,
                severity=f.severity,
                root_cause=f.root_cause,
                title=f"Node {node.name} answers again",
                node_id=node.pk,
                resolves=True,
            )
        )
    return out
