"""Detection rules: pure functions from what telemetry shows to findings. No Django.

The watchdog (incidents.services) builds the views below from each stored batch of
samples (and, for the windowed rules, from the recent samples), runs the rules, and
turns each Finding into an incident and, where the finding says so, an action.
Thresholds default to docs/domain.md's numbers; ops edit them (incidents.Thresholds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

# Root-cause classes (docs/domain.md, "What goes wrong")
NO_ISOLATION = "no_isolation"
RECLAIM_FAILURE = "reclaim_failure"
APP_PARAMETERS = "app_parameters"
HARDWARE = "hardware"
CONNECTIVITY = "connectivity"

INFO, WARNING, CRITICAL = "info", "warning", "critical"
# Rules about the platform's own books, not anything a tenant did: ops' alone (never
# shown to, nor mailed to, a tenant).
# (the node agent's own health, and what it found outside every slice, are ops' too)
OPS_ONLY = frozenset(
    {"accounting_drift", "node_gate_failed", "quota_not_effective", "agent_down", "agent_failed",
     "stray_process"}
)  # fmt: skip
# Every rule an incident can be filed under: the rules here, the sweeps' (oom_exit),
# preemption's (slice_preempted) and the node agent's reports (services.agent_reports).
# The ledger's rule filter offers these; a test holds the
# list to the rules the code files.
RULES = (
    "accounting_drift",
    "agent_down",
    "agent_failed",
    "bandwidth_hog",
    "fleet_sweep",
    "hardware_fault",
    "idle_slice",
    "neighbour_harm",
    "node_gate_failed",
    "node_unreachable",
    "oom_exit",
    "orphan_process",
    "process_jump",
    "quota_breach",
    "quota_not_effective",
    "slice_preempted",
    "slow_leak",
    "stray_process",
    "unattributed_memory",
    "vram_critical",
    "vram_high",
)

# Actions a finding may ask the watchdog to take
CLOSE_GPU = "close_gpu"  # stop new placements on the GPU (circuit breaker)
OPEN_GPU = "open_gpu"  # the breaker closes again
STOP_SLICE = "stop_slice"  # fault isolation / reclaim: that slice's container alone
WARN_IDLE = "warn_idle"
DRAIN_GPU = "drain_gpu"  # hardware fault: no placements, tenants told
THROTTLE = "throttle"
UNTHROTTLE = "unthrottle"
END_ORPHAN = "end_orphan"
PREEMPT = "preempt"  # an interruptible slice stopped with its grace period, to be resumed
NOTIFY_TENANTS = "notify_tenants"

# Xids that mean the GPU itself is in trouble (NVIDIA's Xid catalogue): 13/31/43 are
# usually the application's own faults and only noted.
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})


@dataclass(frozen=True)
class Thresholds:
    vram_warning_pct: float = 85.0
    vram_critical_pct: float = 95.0  # the breaker opens: no new placements
    breaker_reset_pct: float = 85.0  # ... until the card is below this again
    process_jump_mb: int = 3072  # a single jump of more than 3 GB between samples
    sweep_high_pct: float = 90.0
    sweep_rise_mb: int = 5120  # rising more than 5 GB ...
    sweep_window_s: int = 300  # ... within 5 minutes
    leak_window_s: int = 1800  # a leak needs a long window, not a single point
    leak_min_growth_mb: int = 1024
    idle_after_s: int = 900  # no compute for 15 minutes: warn ...
    idle_stop_after_s: int = 300  # ... and reclaim this long after the warning
    bandwidth_pct: float = 70.0  # share of the card's memory bandwidth one process may use
    quota_grace_samples: int = 1  # samples over quota tolerated before the stop
    orphan_confirm_samples: int = 2  # an orphan seen on this many sweeps in a row is ended
    unattributed_mb: int = 1024  # used memory no process accounts for
    drift_min_mb: int = 512  # NVML and the quota library disagree by more than this ...
    drift_pct: float = 10.0  # ... or this share of the larger count, whichever is more,
    drift_samples: int = 2  # ... on this many samples in a row


@dataclass(frozen=True)
class GpuView:
    gpu_id: int
    node_id: int
    uuid: str
    total_mb: int
    used_mb: int
    accepting: bool = True
    breaker_open: bool = False  # closed to placements by the 95% breaker
    hardware_drained: bool = False
    utilization_memory: int | None = None


@dataclass(frozen=True)
class ProcessView:
    gpu_id: int
    pid: int
    used_mb: int
    container_id: str = ""
    sm_utilization: int | None = None
    memory_utilization: int | None = None
    previous_used_mb: int | None = None  # the same pid's reading one sample earlier


@dataclass(frozen=True)
class SliceView:
    slice_id: int
    tenant_id: int
    gpu_id: int
    node_id: int
    container_id: str
    quota_mb: int
    used_mb: int = 0  # the sum of its processes now
    over_quota_streak: int = 0  # consecutive samples over quota, this one included
    throttled: bool = False
    interruptible: bool = False  # bought at the discount: preempted when its card is short
    started_at: float = 0.0  # when it started (a timestamp): the newest is preempted first


@dataclass(frozen=True)
class Finding:
    rule: str
    target: str  # what the rule fired on; one open incident per (rule, target)
    severity: str
    root_cause: str
    title: str
    detail: str = ""
    gpu_id: int | None = None
    node_id: int | None = None
    slice_id: int | None = None
    tenant_id: int | None = None
    action: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    resolves: bool = False  # the condition has cleared: resolve the open incident

    @property
    def key(self) -> tuple[str, str]:
        return (self.rule, self.target)


# How far under a warning line a reading must fall before the warning clears.
CLEAR_MARGIN_PCT = 5.0


def _pct(used: int, total: int) -> float:
    return 100.0 * used / total if total > 0 else 0.0


# --- per sample -------------------------------------------------------------------------------


def vram_pressure(gpu: GpuView, th: Thresholds) -> list[Finding]:
    """85%: warning. 95%: critical, and the card stops taking placements until it is
    below 85% again (hysteresis: a card hovering at 94-96% does not flap)."""
    pct = _pct(gpu.used_mb, gpu.total_mb)
    on_card = partial(
        Finding,
        target=f"gpu:{gpu.uuid}",
        root_cause=NO_ISOLATION,
        gpu_id=gpu.gpu_id,
        node_id=gpu.node_id,
        evidence={"used_mb": gpu.used_mb, "total_mb": gpu.total_mb, "percent": round(pct, 1)},
    )
    out: list[Finding] = []
    if pct >= th.vram_critical_pct:
        out.append(
            on_card(
                rule="vram_critical",
                severity=CRITICAL,
                title=f"GPU VRAM at {pct:.0f}%: placements stopped",
                detail=(
                    f"{gpu.used_mb} of {gpu.total_mb} MiB used (at or over "
                    f"{th.vram_critical_pct:g}%). Running work continues; no new slice "
                    f"lands here until it is below {th.breaker_reset_pct:g}%."
                ),
                action=CLOSE_GPU if not gpu.breaker_open else "",
            )
        )
    elif gpu.breaker_open and pct < th.breaker_reset_pct:
        out.append(
            on_card(
                rule="vram_critical",
                severity=CRITICAL,
                title=f"GPU VRAM back to {pct:.0f}%: placements allowed again",
                action=OPEN_GPU,
                resolves=True,
            )
        )
    if pct >= th.vram_warning_pct:
        out.append(
            on_card(
                rule="vram_high",
                severity=WARNING,
                title=f"GPU VRAM at {pct:.0f}%",
                detail=f"{gpu.used_mb} of {gpu.total_mb} MiB used.",
            )
        )
    elif pct < th.vram_warning_pct - CLEAR_MARGIN_PCT:
        # Cleared only well under the line: a well-packed card at 84-86% must not open
        # and close an incident on every crossing.
        out.append(
            on_card(
                rule="vram_high",
                severity=WARNING,
                title="GPU VRAM below the warning line",
                resolves=True,
            )
        )
    return out


def quota_breach(s: SliceView, th: Thresholds) -> list[Finding]:
    """A slice over its quota (the sum of its processes). After the grace samples its
    container alone is stopped; neighbours are untouched."""
    target = f"slice:{s.slice_id}"
    if s.used_mb <= s.quota_mb:
        return []
    stop = s.over_quota_streak > th.quota_grace_samples
    return [
        Finding(
            rule="quota_breach",
            target=target,
            severity=CRITICAL,
            root_cause=NO_ISOLATION,
            title=f"Slice {s.slice_id} over its VRAM quota",
            detail=(
                f"Its processes hold {s.used_mb} MiB of a {s.quota_mb} MiB quota "
                f"({s.over_quota_streak} sample(s) in a row)."
                + (" Stopping its container alone." if stop else " Grace: one more sample.")
            ),
            gpu_id=s.gpu_id,
            node_id=s.node_id,
            slice_id=s.slice_id,
            tenant_id=s.tenant_id,
            action=STOP_SLICE if stop else "",
            evidence={
                "used_mb": s.used_mb,
                "quota_mb": s.quota_mb,
                "streak": s.over_quota_streak,
                "container_id": s.container_id,
            },
        )
    ]


def process_jump(p: ProcessView, th: Thresholds, *, owner: SliceView | None) -> list[Finding]:
    if p.previous_used_mb is None or p.used_mb - p.previous_used_mb <= th.process_jump_mb:
        return []
    jump = p.used_mb - p.previous_used_mb
    return [
        Finding(
            rule="process_jump",
            target=f"process:{p.gpu_id}:{p.pid}",
            severity=WARNING,
            root_cause=APP_PARAMETERS,
            title=f"Process {p.pid} jumped {jump} MiB in one sample",
            detail=f"From {p.previous_used_mb} to {p.used_mb} MiB.",
            gpu_id=p.gpu_id,
            slice_id=owner.slice_id if owner else None,
            tenant_id=owner.tenant_id if owner else None,
            node_id=owner.node_id if owner else None,
            evidence={"pid": p.pid, "from_mb": p.previous_used_mb, "to_mb": p.used_mb},
        )
    ]


def bandwidth(p: ProcessView, th: Thresholds, *, owner: SliceView | None) -> list[Finding]:
    """A slice whose busiest process uses more than 70% of its card's memory bandwidth
    is throttled on every sample while it stays over, and released when it falls back.
    Call it once per slice with that process (its highest reading)."""
    if owner is None or p.memory_utilization is None:
        return []
    of_slice = partial(
        Finding,
        target=f"slice:{owner.slice_id}",
        gpu_id=p.gpu_id,
        node_id=owner.node_id,
        slice_id=owner.slice_id,
        tenant_id=owner.tenant_id,
        rule="bandwidth_hog",
        severity=WARNING,
        root_cause=APP_PARAMETERS,
        evidence={"pid": p.pid, "memory_utilization": p.memory_utilization},
    )
    if p.memory_utilization > th.bandwidth_pct:
        return [
            of_slice(
                title=f"Slice {owner.slice_id} uses {p.memory_utilization}% of the card's "
                "memory bandwidth",
                detail=f"Over {th.bandwidth_pct:g}%: throttled so neighbours keep theirs.",
                action=THROTTLE,
            )
        ]
    if owner.throttled:
        return [
            of_slice(
                title=f"Slice {owner.slice_id} is back under the bandwidth limit",
                action=UNTHROTTLE,
                resolves=True,
            )
        ]
    return []


def orphans(
    gpu: GpuView,
    processes: list[ProcessView],
    known_containers: set[str],
    th: Thresholds,
    *,
    streaks: dict[tuple[int, int], int],
) -> list[Finding]:
    """Memory held by processes of no slice, or used memory no process accounts for:
    a reclaim failure. An orphan seen `orphan_confirm_samples` times in a row is ended."""
    out: list[Finding] = []
    for p in processes:
        if p.used_mb <= 0 or (p.container_id and p.container_id in known_containers):
            continue
        seen = streaks.get((p.gpu_id, p.pid), 0) + 1
        # Only a container can be ended safely (the watchdog checks it is the platform's
        # and slice-less on the node first); a bare PID is left to ops.
        confirmed = seen >= th.orphan_confirm_samples and bool(p.container_id)
        out.append(
            Finding(
                rule="orphan_process",
                target=f"process:{p.gpu_id}:{p.pid}",
                severity=WARNING,
                root_cause=RECLAIM_FAILURE,
                title=f"Process {p.pid} holds {p.used_mb} MiB and belongs to no slice",
                detail=(
                    "Confirmed on consecutive samples: ending it."
                    if confirmed
                    else "Watching: it is ended if the next sample shows it again."
                ),
                gpu_id=p.gpu_id,
                node_id=gpu.node_id,
                action=END_ORPHAN if confirmed else "",
                evidence={
                    "pid": p.pid,
                    "used_mb": p.used_mb,
                    "container_id": p.container_id,
                    "seen": seen,
                },
            )
        )
    attributed = sum(p.used_mb for p in processes)
    if not processes and gpu.used_mb - attributed > th.unattributed_mb:
        out.append(
            Finding(
                rule="unattributed_memory",
                target=f"gpu:{gpu.uuid}",
                severity=WARNING,
                root_cause=RECLAIM_FAILURE,
                title=f"{gpu.used_mb} MiB used on a GPU with no process",
                detail="Memory was not released when its process ended.",
                gpu_id=gpu.gpu_id,
                node_id=gpu.node_id,
                evidence={"used_mb": gpu.used_mb, "processes": 0},
            )
        )
    return out


def hardware(
    gpu: GpuView,
    *,
    xids: list[tuple[int, str]],
    ecc_uncorrected: int | None,
    remapped_rows_failure: bool,
) -> list[Finding]:
    """Xid, uncorrectable ECC or row-remapping failure: drain the GPU, tell its tenants."""
    serious = [(x, raw) for x, raw in xids if x in HARDWARE_XIDS]
    reasons = [f"Xid {x}" for x, _ in serious]
    if ecc_uncorrected:
        reasons.append(f"{ecc_uncorrected} uncorrectable ECC error(s)")
    if remapped_rows_failure:
        reasons.append("row remapping failed")
    if not reasons:
        return []
    return [
        Finding(
            rule="hardware_fault",
            target=f"gpu:{gpu.uuid}",
            severity=CRITICAL,
            root_cause=HARDWARE,
            title=f"Hardware fault on GPU {gpu.uuid[:12]}: {', '.join(reasons)}",
            detail="The GPU takes no new slices; tenants on it are told.",
            gpu_id=gpu.gpu_id,
            node_id=gpu.node_id,
            action=DRAIN_GPU if not gpu.hardware_drained else "",
            evidence={
                "xid_lines": [raw for _, raw in serious],
                "ecc_uncorrected": ecc_uncorrected,
                "remapped_rows_failure": remapped_rows_failure,
            },
        )
    ]


def unreachable(node_id: int, name: str, reason: str) -> Finding:
    return Finding(
        rule="node_unreachable",
        target=f"node:{name}",
        severity=CRITICAL,
        root_cause=CONNECTIVITY,
        title=f"Node {name} is unreachable",
        detail=reason[:300],
        node_id=node_id,
        action=NOTIFY_TENANTS,
        evidence={"reason": reason[:300]},
    )


def gate_failed(node_id: int, name: str, reason: str) -> Finding:
    """The preflight gate holds the node: no new placements; running slices go on."""
    return Finding(
        rule="node_gate_failed",
        target=f"node:{name}",
        severity=WARNING,
        root_cause=NO_ISOLATION,
        title=f"Node {name} failed its preflight: it takes no new slices",
        detail=reason[:300],
        node_id=node_id,
        evidence={"reason": reason[:1000]},
    )


def quota_not_effective(
    node_id: int, name: str, models: list[str], *, by_environment: bool = False
) -> Finding:
    """The quota library is installed but a probe got past its quota (with the library
    preloaded, or by setting or unsetting its own environment inside the container): the
    node's cards of these models are sold whole until it is fixed or ops accept
    watchdog-only."""
    return Finding(
        rule="quota_not_effective",
        target=f"node:{name}",
        severity=WARNING,
        root_cause=NO_ISOLATION,
        title=f"Node {name}: the VRAM quota library does not enforce; "
        f"{', '.join(models)} sold whole only",
        detail=(
            "A probe container lifted its own quota from inside (CUDA_DISABLE_CONTROL, its "
            "own limit, or no LD_PRELOAD): this node's library takes its settings from the "
            "process's environment, not from the node."
            if by_environment
            else "A probe container allocated past its quota with the library preloaded."
        ),
        node_id=node_id,
        evidence={"models": models},
    )


# --- over a window ----------------------------------------------------------------------------


def fleet_sweep(
    gpu: GpuView,
    series: list[tuple[float, int]],
    th: Thresholds,
    *,
    in_quota: dict[float, int] | None = None,
) -> list[Finding]:
    """The runbook's first step: cards above 90%, or rising more than 5 GB within the
    sweep window. `series` is (seconds, used MiB), oldest first, ending now. `in_quota`:
    at each of those seconds, what the card's slices held within their own quotas. A
    slice that starts, loads its model or trains up to its quota is what was sold (and
    placement made room for it); the rise that matters is the rest: memory of no slice,
    or a slice's beyond its quota."""
    pct = _pct(gpu.used_mb, gpu.total_mb)
    rise = 0
    since = None
    if series:
        end = series[-1][0]
        recent = [(t, mb) for t, mb in series if t >= end - th.sweep_window_s]
        if recent:
            held = in_quota or {}
            outside = [(t, mb - held.get(t, 0)) for t, mb in recent]
            low_t, low = min(outside, key=lambda p: p[1])
            rise = max(0, outside[-1][1] - low)
            since = low_t
        high = th.sweep_high_pct * gpu.total_mb / 100
        above = [t for t, mb in series if mb > high]
        if pct > th.sweep_high_pct and above:
            # when the card went (and stayed) above the line, within what we can see
            since = next(
                (t for i, (t, _) in enumerate(series) if all(mb > high for _, mb in series[i:])),
                above[0],
            )
    flagged = pct > th.sweep_high_pct or rise > th.sweep_rise_mb
    if not flagged and pct > th.sweep_high_pct - CLEAR_MARGIN_PCT and rise > 0:
        return []  # between the lines: neither flagged again nor cleared
    return [
        Finding(
            rule="fleet_sweep",
            target=f"gpu:{gpu.uuid}",
            severity=WARNING,
            root_cause=NO_ISOLATION,
            title=(
                f"Card at {pct:.0f}%"
                + (
                    f", up {rise} MiB in {th.sweep_window_s // 60} min"
                    if rise > th.sweep_rise_mb
                    else ""
                )
                if flagged
                else "Card back to normal"
            ),
            gpu_id=gpu.gpu_id,
            node_id=gpu.node_id,
            evidence={"percent": round(pct, 1), "rise_mb": rise, "since_epoch": since},
            resolves=not flagged,
        )
    ]


def leak_or_burst(series: list[tuple[float, int]], th: Thresholds) -> str | None:
    """'leak' for steady growth across the long window, 'burst' for growth that came in
    one or two jumps, None for neither. A leak climbs in many small steps: most steps
    go up, no single step carries most of the growth, and the window is covered."""
    if len(series) < 4:
        return None
    span = series[-1][0] - series[0][0]
    growth = series[-1][1] - series[0][1]
    if span < 0.8 * th.leak_window_s or growth < th.leak_min_growth_mb:
        return None
    steps = [b[1] - a[1] for a, b in zip(series, series[1:], strict=False)]
    rising = sum(1 for d in steps if d > 0)
    falling = sum(1 for d in steps if d < 0)
    top = sorted(steps, reverse=True)
    if top[0] > 0.5 * growth or sum(top[:2]) > 0.8 * growth:
        return "burst"  # one or two jumps carry the growth
    if rising >= 0.6 * len(steps) and falling <= 0.2 * len(steps):
        return "leak"
    return None


def slow_leak(s: SliceView, series: list[tuple[float, int]], th: Thresholds) -> list[Finding]:
    verdict = leak_or_burst(series, th)
    if verdict != "leak":
        return []
    growth = series[-1][1] - series[0][1]
    minutes = (series[-1][0] - series[0][0]) / 60
    return [
        Finding(
            rule="slow_leak",
            target=f"slice:{s.slice_id}",
            severity=WARNING,
            root_cause=RECLAIM_FAILURE,
            title=f"Slice {s.slice_id} grows steadily: {growth} MiB in {minutes:.0f} min",
            detail=(
                "Steady growth over the long window, not a burst: a leak. At this rate it "
                f"reaches its {s.quota_mb} MiB quota and is stopped."
            ),
            gpu_id=s.gpu_id,
            node_id=s.node_id,
            slice_id=s.slice_id,
            tenant_id=s.tenant_id,
            evidence={
                "growth_mb": growth,
                "minutes": round(minutes, 1),
                "points": len(series),
                "since_epoch": series[0][0],
            },
        )
    ]


def drift_threshold_mb(nvml_mb: int, library_mb: int, th: Thresholds) -> int:
    return max(th.drift_min_mb, int(th.drift_pct * max(nvml_mb, library_mb) / 100))


def accounting_drift(
    s: SliceView, *, nvml_mb: int, library_mb: int, streak: int, th: Thresholds
) -> list[Finding]:
    """The two counts of a slice's memory disagree: what NVML says its processes hold
    and what the node's quota library counts (it misses what it does not intercept:
    cuMemCreate pools, context memory, a process it was not loaded into). `streak`: the
    samples in a row, this one included, that disagreed."""
    threshold = drift_threshold_mb(nvml_mb, library_mb, th)
    of_slice = partial(
        Finding,
        target=f"slice:{s.slice_id}",
        gpu_id=s.gpu_id,
        node_id=s.node_id,
        slice_id=s.slice_id,
        tenant_id=s.tenant_id,
        rule="accounting_drift",
        root_cause=NO_ISOLATION,
    )
    if abs(nvml_mb - library_mb) <= threshold:
        return [
            of_slice(
                severity=INFO,
                title=f"Slice {s.slice_id}: NVML and the quota library agree again",
                resolves=True,
            )
        ]
    if streak < th.drift_samples:
        return []
    # Memory the library does not see escaped it: a static job, raw device calls, books
    # written over from inside. Nothing inside the container holds that memory to the
    # quota, so the slice is stopped before it can take a neighbour's. More counted than
    # NVML sees harms nobody but the slice itself: a warning.
    escaped = nvml_mb > library_mb
    return [
        of_slice(
            severity=CRITICAL if escaped else WARNING,
            title=(
                f"Slice {s.slice_id}: NVML counts {nvml_mb} MiB, the quota library {library_mb} MiB"
            ),
            detail=(
                "The quota library does not see all of this slice's memory, so its quota "
                "is not what holds it. Stopping its container alone."
                if escaped
                else "The quota library counts more than NVML sees."
            ),
            action=STOP_SLICE if escaped else "",
            evidence={
                "nvml_mb": nvml_mb,
                "library_mb": library_mb,
                "difference_mb": nvml_mb - library_mb,
                "threshold_mb": threshold,
                "samples": streak,
            },
        )
    ]


def duration(seconds: float) -> str:
    """A span in words, the same everywhere a title, a reason or a mail gives it:
    "45 seconds", "1 minute", "7 minutes", "2 hours"."""
    seconds = max(0, int(round(seconds)))
    if seconds < 120:
        return f"{seconds} second{'s' if seconds != 1 else ''}" if seconds < 60 else "1 minute"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} minutes"
    return f"{minutes // 60} hours"


def idle(
    s: SliceView,
    *,
    idle_for_s: float | None,
    warned_for_s: float | None,
    th: Thresholds,
    now_epoch: float | None = None,
) -> list[Finding]:
    """No compute for `idle_after_s`: warn; still idle `idle_stop_after_s` after the
    warning: stop the slice and release its memory. `idle_for_s` None: it computed."""
    if idle_for_s is None or idle_for_s < th.idle_after_s:
        return []
    stop = warned_for_s is not None and warned_for_s >= th.idle_stop_after_s
    return [
        Finding(
            rule="idle_slice",
            target=f"slice:{s.slice_id}",
            severity=INFO if not stop else WARNING,
            root_cause=RECLAIM_FAILURE,
            title=f"Slice {s.slice_id} idle for {duration(idle_for_s)}",
            detail=(
                "No compute activity: its memory is released now."
                if stop
                else f"No compute activity for {duration(idle_for_s)}: it is stopped in "
                f"{duration(th.idle_stop_after_s)} unless it computes again."
            ),
            gpu_id=s.gpu_id,
            node_id=s.node_id,
            slice_id=s.slice_id,
            tenant_id=s.tenant_id,
            action=STOP_SLICE if stop else (WARN_IDLE if warned_for_s is None else ""),
            evidence={
                "idle_s": int(idle_for_s),
                "used_mb": s.used_mb,
                "since_epoch": None if now_epoch is None else now_epoch - idle_for_s,
            },
        )
    ]
