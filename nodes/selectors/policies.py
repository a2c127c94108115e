"""The two policies, read: the preflight (node) policy row the gate judges by, and the
GPU overcommit advice (the highest ratio a card's rollup history allows)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, Decimal
from typing import TypedDict

from django.db.models import Count, Max, Min
from django.utils import timezone

from ..models import Gpu, GpuDayRollup, NodePolicy


def preflight_policy() -> NodePolicy:
    """The one preflight (node) policy row, made with the defaults on first use (the gate's
    rules; not the GPU overcommit policy)."""
    policy = NodePolicy.objects.filter(pk=1).first()
    if policy is None:
        policy, _ = NodePolicy.objects.get_or_create(pk=1)
    return policy


MIN_HISTORY_DAYS = 7
MAX_HISTORY_DAYS = 30


class RollupWindow(TypedDict):
    """One GPU's day rollups over the last 30 UTC days."""

    first: datetime | None  # the first bucket
    peak: int | None  # MiB
    days: int  # days with samples


class RatioAdvice(TypedDict):
    """The highest overcommit ratio a GPU's history allows, and why."""

    days_of_history: int
    peak_mb: int | None
    ratio: Decimal | None  # None: no overcommit (no week of history, or MIG)
    reason: str


def rollup_windows(*, gpu_ids: list[int], now: datetime | None = None) -> dict[int, RollupWindow]:
    """Per GPU, over the last 30 UTC days: the first bucket, the peak, and on how many
    days there are samples at all. Read from the day rollups (30 rows per GPU, where the
    five-minute rollups hold 8,640): one query for a page of GPUs or for the fleet."""
    now = now or timezone.now()
    since = (now - timedelta(days=MAX_HISTORY_DAYS)).astimezone(UTC).date()
    rows = (
        GpuDayRollup.objects.filter(gpu_id__in=gpu_ids, day__gte=since)
        .values("gpu_id")
        .annotate(
            first=Min("first_bucket_start"),
            peak=Max("memory_used_max_mb"),
            days=Count("pk"),
        )
        .order_by()
    )
    return {row["gpu_id"]: row for row in rows}


def gpu_recommended_ratio(
    *, gpu: Gpu, now: datetime | None = None, window: RollupWindow | None = None
) -> RatioAdvice:
    """The highest overcommit ratio docs/domain.md allows for this GPU: physical VRAM over the
    peak use seen in the last 7-30 days of rollups, rounded down; None unless samples
    cover at least 7 distinct days (two samples a week apart are not a week of history)."""
    now = now or timezone.now()
    if window is None:
        window = rollup_windows(gpu_ids=[gpu.pk], now=now).get(gpu.pk)
    window = window or {"first": None, "peak": None, "days": 0}
    covered = int(window["days"] or 0)
    out: RatioAdvice = {
        "days_of_history": covered,
        "peak_mb": window["peak"],
        "ratio": None,
        "reason": "",  # said below
    }
    if gpu.mig_enabled:
        out["reason"] = "MIG partitions and overcommit exclude each other."
    elif covered < MIN_HISTORY_DAYS or not window["peak"]:
        out["reason"] = (
            f"Needs samples on {MIN_HISTORY_DAYS} days; this GPU has {covered}. "
            "A ratio is never guessed."
        )
    else:
        ratio = Decimal(gpu.vram_total_mb) / Decimal(window["peak"])
        ratio = min(max(ratio, Decimal("1.00")), Decimal("4.00")).quantize(
            Decimal("0.01"), rounding=ROUND_DOWN
        )
        out["ratio"] = ratio
        out["reason"] = (
            f"{gpu.vram_total_mb} MiB physical / {window['peak']} MiB peak over "
            f"{covered} days with samples."
        )
    return out
