"""Reads of the fleet for pages, API and /metrics: one query shape each."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Prefetch, Q, QuerySet
from django.utils import timezone

from .models import (
    Allocation,
    Gpu,
    GpuSample,
    GpuSampleRollup,
    Node,
    NodePolicyChange,
    ProcessSample,
)

MAX_POINTS = 500


def gpus_with_allocation() -> QuerySet[Gpu]:
    # `allocated_mb` is a counter kept on the row by placement: no aggregate needed.
    return Gpu.objects.all()


def gpu_shapes_in_service() -> list[dict]:
    """One row per distinct card shape that takes placements now (model, size, MIG layout,
    whole-card rule): what the tier catalog says each tier runs on. One query."""
    rows = (
        Gpu.objects.taking_placements()
        .values_list("model", "vram_total_mb", "mig_enabled", "whole_card_only", "mig_devices")
        .order_by("model")
    )
    shapes: dict[tuple, dict] = {}
    for model, total_mb, mig_enabled, whole, devices in rows:
        sizes = tuple(sorted(int(d.get("memory_total_mb") or 0) for d in devices or []))
        key = (model, total_mb, mig_enabled, whole, sizes if mig_enabled else ())
        shape = shapes.setdefault(
            key,
            {
                "model": model,
                "total_mb": total_mb,
                "mig_enabled": mig_enabled,
                "whole_card_only": whole,
                "mig_sizes_mb": key[4],
                "count": 0,
            },
        )
        shape["count"] += 1
    return list(shapes.values())


def node_list() -> QuerySet[Node]:
    return Node.objects.prefetch_related(
        Prefetch("gpus", queryset=gpus_with_allocation().filter(present=True).order_by("index"))
    ).order_by("name")


def node_policy_changes() -> QuerySet[NodePolicyChange]:
    return NodePolicyChange.objects.select_related("changed_by", "node").order_by(
        "-changed_at", "-pk"
    )


def gpu_list(*, node_id: int | None = None) -> QuerySet[Gpu]:
    qs = gpus_with_allocation().select_related("node").order_by("node__name", "index")
    return qs.filter(node_id=node_id) if node_id else qs


def interruptible_counts(*, gpu_ids: list[int], now: datetime | None = None) -> dict[int, dict]:
    """Per GPU: interruptible reservations held now and how many the watchdog took back
    in the last 7 and 30 days (what the overcommit page shows). One query."""
    now = now or timezone.now()
    week, month = now - timedelta(days=7), now - timedelta(days=30)
    rows = (
        Allocation.objects.filter(gpu_id__in=gpu_ids, interruptible=True)
        .filter(Q(preempted_at__gte=month) | ~Q(state=Allocation.State.RELEASED))
        .values("gpu_id")
        .annotate(
            held=Count("pk", filter=~Q(state=Allocation.State.RELEASED)),
            preempted_7d=Count("pk", filter=Q(preempted_at__gte=week)),
            preempted_30d=Count("pk", filter=Q(preempted_at__gte=month)),
        )
    )
    empty = {"held": 0, "preempted_7d": 0, "preempted_30d": 0}
    out = {pk: dict(empty) for pk in gpu_ids}
    for row in rows:
        out[row.pop("gpu_id")] = row
    return out


def fleet_totals(nodes: list[Node]) -> dict:
    gpus = [g for n in nodes for g in n.gpus.all()]
    return {
        "nodes": len(nodes),
        "by_status": {s: sum(1 for n in nodes if n.status == s) for s in Node.Status.values},
        "gpus": len(gpus),
        "vram_total_mb": sum(g.vram_total_mb for g in gpus),
        "vram_used_mb": sum(g.last_memory_used_mb or 0 for g in gpus),
        "vram_allocated_mb": sum(g.allocated_mb or 0 for g in gpus),
    }


def latest_processes(*, gpu_ids: list[int]) -> dict[int, list[ProcessSample]]:
    """The processes of each GPU's latest sample, with the owner key of their container."""
    gpus = Gpu.objects.filter(pk__in=gpu_ids, last_sample_at__isnull=False)
    out: dict[int, list[ProcessSample]] = {g: [] for g in gpu_ids}
    cond = Q()
    for gpu in gpus:
        cond |= Q(gpu_id=gpu.pk, taken_at=gpu.last_sample_at)
    if not cond:
        return out
    rows = list(ProcessSample.objects.filter(cond).order_by("gpu_id", "-used_memory_mb"))
    owners = dict(
        Allocation.objects.filter(container_id__in={r.container_id for r in rows if r.container_id})
        .exclude(state=Allocation.State.RELEASED)
        .values_list("container_id", "owner_key")
    )
    for row in rows:
        row.owner_key = owners.get(row.container_id, "")  # type: ignore[attr-defined]
        out.setdefault(row.gpu_id, []).append(row)
    return out


@dataclass
class Point:
    t: datetime
    used_mb: float
    used_max_mb: float
    util: float | None


def gpu_series(*, gpu: Gpu, start: datetime, end: datetime, max_points: int = MAX_POINTS) -> dict:
    """VRAM used (mean and max) and utilization over [start, end], at most max_points.

    Raw samples where they are kept; five-minute rollups for older ranges."""
    raw_from = timezone.now() - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS)
    rows: list[tuple[datetime, float, float, float | None]] = []
    if start < raw_from:
        rows += [
            (r.bucket_start, r.memory_used_mean_mb, r.memory_used_max_mb, r.utilization_gpu_mean)
            for r in GpuSampleRollup.objects.filter(
                gpu=gpu, bucket_start__gte=start, bucket_start__lt=min(end, raw_from)
            ).order_by("bucket_start")
        ]
    rows += [
        (t, float(u), float(u), util)
        for t, u, util in GpuSample.objects.filter(
            gpu=gpu, taken_at__gte=max(start, raw_from) if rows else start, taken_at__lte=end
        )
        .order_by("taken_at")
        .values_list("taken_at", "memory_used_mb", "utilization_gpu")
    ]
    points = downsample(rows, start=start, end=end, max_points=max_points)
    return {
        "gpu": gpu.pk,
        "start": start,
        "end": end,
        "memory_total_mb": gpu.vram_total_mb,
        "points": [
            {
                "t": p.t,
                "used_mb": round(p.used_mb, 1),
                "used_max_mb": p.used_max_mb,
                "util": None if p.util is None else round(p.util, 1),
            }
            for p in points
        ],
    }


def downsample(rows, *, start: datetime, end: datetime, max_points: int) -> list[Point]:  # type: ignore[no-untyped-def]
    """Fold (t, mean, max, util) rows into at most max_points equal time buckets."""
    if len(rows) <= max_points:
        return [Point(t, m, mx, u) for t, m, mx, u in rows]
    width = max((end - start).total_seconds() / max_points, 1e-6)
    buckets: dict[int, list] = {}
    for t, mean, peak, util in rows:
        index = min(int((t - start).total_seconds() / width), max_points - 1)
        buckets.setdefault(index, []).append((mean, peak, util))
    points = []
    for index in sorted(buckets):
        items = buckets[index]
        utils = [u for _, _, u in items if u is not None]
        points.append(
            Point(
                t=start + timedelta(seconds=index * width),
                used_mb=sum(m for m, _, _ in items) / len(items),
                used_max_mb=max(p for _, p, _ in items),
                util=sum(utils) / len(utils) if utils else None,
            )
        )
    return points
