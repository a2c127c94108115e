"""Preemption: which interruptible slices a card at its warning line gives up, newest
first, until what stays is under the line; guaranteed work never. Pure Python: no Django."""

from __future__ import annotations

from .rules import NO_ISOLATION, PREEMPT, WARNING, Finding, GpuView, SliceView, Thresholds


def _pct(used: int, total: int) -> float:
    return 100.0 * used / total if total > 0 else 0.0


def preemptions(gpu: GpuView, on_card: list[SliceView], th: Thresholds) -> list[Finding]:
    """At the warning line the card's interruptible slices are preempted, newest first,
    until what stays is back under it; guaranteed slices never are."""
    line = gpu.total_mb * th.vram_warning_pct / 100
    if gpu.used_mb < line:
        return []
    out: list[Finding] = []
    used = gpu.used_mb
    newest_first = sorted(
        (s for s in on_card if s.interruptible), key=lambda s: (-s.started_at, -s.slice_id)
    )
    for s in newest_first:
        if used < line:
            break
        pct = _pct(gpu.used_mb, gpu.total_mb)
        out.append(
            Finding(
                rule="slice_preempted",
                severity=WARNING,
                root_cause=NO_ISOLATION,
                title=f"Interruptible slice {s.slice_id} preempted: GPU VRAM at {pct:.0f}%",
                detail=(
                    f"The card reached {pct:.0f}% of its memory (the line is "
                    f"{th.vram_warning_pct:g}%), so its newest interruptible slices are "
                    "stopped, each with its grace period to checkpoint. Volumes are kept; "
                    "resume it when you like."
                ),
                gpu_id=gpu.gpu_id,
                node_id=gpu.node_id,
                slice_id=s.slice_id,
                tenant_id=s.tenant_id,
                target=f"slice:{s.slice_id}",
                action=PREEMPT,
                evidence={
                    "gpu_used_mb": gpu.used_mb,
                    "total_mb": gpu.total_mb,
                    "percent": round(pct, 1),
                    "slice_used_mb": s.used_mb,
                },
            )  # fmt: skip
        )
        used -= s.used_mb
    return out
