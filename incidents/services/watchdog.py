"""The watchdog on each stored batch of samples, and how findings become incidents and
actions (`findings_apply`, shared with the minute's sweep).

`batch_watch` runs as a nodes sample hook (incidents.hooks), in the telemetry worker,
right after the batch commits. Findings (incidents.rules) become deduplicated incidents;
their actions are carried out by incidents.services.dispose.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from gpuplatform.errors import ServiceError
from gpuplatform.ops import require_ops
from nodes.devices import allocation_quota
from nodes.hooks import GpuSampleRow, SampleBatch
from nodes.models import Gpu, GpuSample, ProcessSample
from nodes.telemetry import GpuReading
from tenants.models import Slice

from .. import preemption, rules
from ..locks import thresholds_lock
from ..models import HARDWARE_REASON, GpuWatch, Incident, IncidentEvent, SliceWatch, Thresholds
from ..notify import incident_notify
from ..selectors import LiveSlice, live_slices
from .dispose import finding_act
from .ledger import (
    SEVERITY_RANK,
    IncidentContext,
    incident_clear,
    incident_event,
    incident_mitigate,
    incident_record,
    incident_resolve_locked,
)

logger = logging.getLogger(__name__)

E = IncidentEvent.Kind
# Done once per incident, not again on every repeat of the finding (a stop is asked for
# again while the slice still runs: its task is idempotent, and a lost one is retried).
ONE_SHOT_ACTIONS = (rules.NOTIFY_TENANTS, rules.DRAIN_GPU, rules.END_ORPHAN, rules.PREEMPT)


@transaction.atomic
def thresholds_update(*, actor: User, **changes: Any) -> Thresholds:
    require_ops(actor, what="manage incidents")
    row = Thresholds.current()
    row = thresholds_lock(row.pk)
    for name, value in changes.items():
        if not hasattr(row, name) or name in ("id", "updated_at", "updated_by"):
            raise ServiceError(f"Unknown threshold {name}.", field=name)
        setattr(row, name, value)
    row.updated_by = actor
    try:
        with transaction.atomic():
            row.full_clean(exclude=["updated_by"])
            row.save()
    except Exception as exc:  # ValidationError or IntegrityError: say which rule
        raise ServiceError(
            "Thresholds must stay ordered (0 < warning <= critical <= 100, "
            "placements resume at or below critical) and limits at or above their safe minimums.",
            field="thresholds",
        ) from exc
    return row


# --- the watchdog, per batch ------------------------------------------------------------------


def batch_watch(*, batch: SampleBatch) -> dict[str, int]:
    """Run the per-sample rules on a stored batch and act on what they find."""
    if not batch.gpu_samples:
        return {}
    th_row = Thresholds.current()
    th = th_row.as_rules()
    now = batch.gpu_samples[0].taken_at
    # Everything is read by node (a batch is up to 200 nodes, 1,600 GPUs): short IN
    # lists and plain rows keep the hook a fraction of the ingest it follows.
    node_ids = [n.pk for n in batch.nodes]
    watches = {w.gpu_id: w for w in GpuWatch.objects.filter(gpu__node_id__in=node_ids)}
    slices, _ = live_slices(node_ids=node_ids)
    slice_watches = slice_watches_ensure(slice_ids=[r["pk"] for r in slices])
    # Jumps are judged for processes of running slices (the rest are the sweep's orphans):
    # the previous readings are fetched for those containers only.
    previous = _previous_process_readings({r["cid"] for r in slices}, now) if slices else {}
    procs_by_gpu = _processes_by_gpu(batch, previous)
    findings, owners, active_ids = _slice_rules(
        batch, slices, slice_watches, procs_by_gpu, th=th, now=now
    )
    readings = {
        g.uuid: g
        for sample in batch.samples.values()
        for g in sample.gpus
        if g.ecc_uncorrected_volatile or g.remapped_rows_failure
    }
    with_xids = {node_id for node_id, sample in batch.samples.items() if sample.xid_events}
    open_keys = _open_keys()
    flagged = {key[1] for key in open_keys}  # targets with an open incident
    process_findings, loud = _sample_rules(
        batch, procs_by_gpu, owners, watches, readings, flagged, th=th
    )
    findings += process_findings
    findings += _preemptions(batch, owners, th)
    # The common case on a healthy fleet is that no card needs a card-level rule: the
    # GPU rows are read only for those that do (and for nodes that reported an Xid).
    gpus = _gpu_rows(
        gpu_ids={r.gpu_id for r in loud},
        node_ids=with_xids,
    )
    xids = _xids_by_gpu(batch, gpus)
    loud += [r for r in batch.gpu_samples if r.gpu_id in xids and r not in loud]
    findings += _card_rules(loud, gpus, watches, readings, xids, th=th)
    findings += _off_the_bus_rules(batch, gpus, xids)
    findings += _computing_again(active_ids)
    return findings_apply(findings=findings, now=now, gpus=gpus, open_keys=open_keys)


def _processes_by_gpu(
    batch: SampleBatch, previous: dict[tuple[int, int], int]
) -> dict[int, list[rules.ProcessView]]:
    """The batch's processes by GPU, each with its reading one sample before."""
    procs_by_gpu: dict[int, list[rules.ProcessView]] = defaultdict(list)
    for p in batch.process_samples:
        procs_by_gpu[p.gpu_id].append(
            rules.ProcessView(
                gpu_id=p.gpu_id,
                pid=p.pid,
                used_mb=p.used_memory_mb,
                container_id=p.container_id,
                sm_utilization=p.sm_utilization,
                memory_utilization=p.memory_utilization,
                previous_used_mb=previous.get((p.gpu_id, p.pid)),
            )
        )
    return procs_by_gpu


def _slice_rules(
    batch: SampleBatch,
    slices: list[LiveSlice],
    slice_watches: dict[int, SliceWatch],
    procs_by_gpu: dict[int, list[rules.ProcessView]],
    *,
    th: rules.Thresholds,
    now: datetime,
) -> tuple[list[rules.Finding], dict[str, rules.SliceView], list[int]]:
    """Quota breaches and accounting drift of the running slices, their streaks
    remembered; also each slice's view by container, and the slices that compute."""
    findings: list[rules.Finding] = []
    owners: dict[str, rules.SliceView] = {}
    active_ids: list[int] = []
    for row in slices:
        used = sum(p.used_mb for p in procs_by_gpu[row["gpu_id"]] if p.container_id == row["cid"])
        watch = slice_watches[row["pk"]]
        streak = watch.over_quota_streak + 1 if used > row["quota"] else 0
        # Unknown utilisation (MIG devices, nvidia-smi nodes report none) is not idleness.
        active = any(
            p.sm_utilization is None or p.sm_utilization > 0
            for p in procs_by_gpu[row["gpu_id"]]
            if p.container_id == row["cid"]
        )
        # the quota library's count beside NVML's, where the node keeps its books
        library = None if row["mig"] else batch.quota_usage.get(row["cid"])
        drift = 0
        if library is not None:
            apart = abs(used - library) > rules.drift_threshold_mb(used, library, th)
            drift = watch.drift_streak + 1 if apart else 0
        _remember_slice(watch, streak=streak, drift=drift)
        if active:
            active_ids.append(row["pk"])
        view = rules.SliceView(
            slice_id=row["pk"],
            tenant_id=row["tenant_id"],
            gpu_id=row["gpu_id"],
            node_id=row["node_id"],
            container_id=row["cid"],
            quota_mb=row["quota"],
            used_mb=used,
            over_quota_streak=streak,
            throttled=watch.throttled_at is not None,
            interruptible=row["interruptible"],
            started_at=row["started"],
        )
        owners[row["cid"]] = view
        findings += rules.quota_breach(view, th)
        if library is not None:
            findings += rules.accounting_drift(
                view, nvml_mb=used, library_mb=library, streak=drift, th=th
            )
    if active_ids:  # computing again: not idle (and a later idle spell warns afresh)
        SliceWatch.objects.filter(slice_id__in=active_ids).update(
            last_active_at=now, idle_warned_at=None
        )
    return findings, owners, active_ids


def _preemptions(
    batch: SampleBatch, owners: dict[str, rules.SliceView], th: rules.Thresholds
) -> list[rules.Finding]:
    """Interruptible slices to preempt on the cards at or over the warning line."""
    by_gpu: dict[int, list[rules.SliceView]] = {}
    for view in owners.values():
        if view.interruptible:
            by_gpu.setdefault(view.gpu_id, []).append(view)
    if not by_gpu:
        return []  # the common case: no interruptible slice runs on these nodes
    out: list[rules.Finding] = []
    for r in batch.gpu_samples:
        on_card = by_gpu.get(r.gpu_id)
        if not on_card:
            continue
        gpu = rules.GpuView(
            gpu_id=r.gpu_id,
            node_id=on_card[0].node_id,
            uuid=batch.gpu_uuids.get(r.gpu_id, ""),
            total_mb=r.memory_total_mb,
            used_mb=r.memory_used_mb,
        )
        out += preemption.preemptions(gpu, on_card, th)
    return out


def _sample_rules(
    batch: SampleBatch,
    procs_by_gpu: dict[int, list[rules.ProcessView]],
    owners: dict[str, rules.SliceView],
    watches: dict[int, GpuWatch],
    readings: dict[str, GpuReading],
    flagged: set[str],
    *,
    th: rules.Thresholds,
) -> tuple[list[rules.Finding], list[GpuSampleRow]]:
    """Per card sample, its processes' jumps and bandwidth; and the samples whose card
    needs the card-level rules (loud), leaving out the quiet ones."""
    findings: list[rules.Finding] = []
    quiet_below = th.vram_warning_pct - rules.CLEAR_MARGIN_PCT
    loud = []
    for r in batch.gpu_samples:
        findings += _process_rules(procs_by_gpu[r.gpu_id], owners, th)
        uuid = batch.gpu_uuids.get(r.gpu_id, "")
        watch = watches.get(r.gpu_id)
        quiet = (
            100 * r.memory_used_mb < quiet_below * r.memory_total_mb
            and not (watch and watch.breaker_open)
            and uuid
            and uuid not in readings
            and f"gpu:{uuid}" not in flagged
        )
        if not quiet:
            loud.append(r)
    return findings, loud


def _card_rules(
    loud: list[GpuSampleRow],
    gpus: dict[int, GpuRow],
    watches: dict[int, GpuWatch],
    readings: dict[str, GpuReading],
    xids: dict[int, list[tuple[int, str]]],
    *,
    th: rules.Thresholds,
) -> list[rules.Finding]:
    """VRAM pressure and hardware faults of the loud cards."""
    findings: list[rules.Finding] = []
    for r in loud:
        gpu = gpus.get(r.gpu_id)
        if gpu is None:
            continue
        watch = watches.get(r.gpu_id)
        view = rules.GpuView(
            gpu_id=gpu.pk,
            node_id=gpu.node_id,
            uuid=gpu.uuid,
            total_mb=r.memory_total_mb,
            used_mb=r.memory_used_mb,
            accepting=gpu.accepting_placements,
            breaker_open=bool(watch and watch.breaker_open),
            hardware_drained=not gpu.accepting_placements
            and gpu.not_accepting_reason.startswith(HARDWARE_REASON),
            utilization_memory=r.utilization_memory,
        )
        findings += rules.vram_pressure(view, th)
        reading = readings.get(gpu.uuid)
        findings += rules.hardware(
            view,
            xids=xids.get(gpu.pk, []),
            ecc_uncorrected=getattr(reading, "ecc_uncorrected_volatile", None),
            remapped_rows_failure=bool(getattr(reading, "remapped_rows_failure", False)),
        )
    return findings


def _off_the_bus_rules(
    batch: SampleBatch, gpus: dict[int, GpuRow], xids: dict[int, list[tuple[int, str]]]
) -> list[rules.Finding]:
    """A card that fell off the bus (Xid 79) is gone from NVML: its Xid comes from the
    kernel log with no reading of the card beside it. It is drained all the same."""
    findings: list[rules.Finding] = []
    sampled = {r.gpu_id for r in batch.gpu_samples}
    for gpu_id in xids.keys() - sampled:
        gpu = gpus[gpu_id]
        view = rules.GpuView(
            gpu_id=gpu.pk,
            node_id=gpu.node_id,
            uuid=gpu.uuid,
            total_mb=0,
            used_mb=0,
            accepting=gpu.accepting_placements,
            hardware_drained=not gpu.accepting_placements
            and gpu.not_accepting_reason.startswith(HARDWARE_REASON),
        )
        findings += rules.hardware(
            view, xids=xids[gpu_id], ecc_uncorrected=None, remapped_rows_failure=False
        )
    return findings


def _computing_again(active_ids: list[int]) -> list[rules.Finding]:
    """Slices computing again: their idle incidents have cleared."""
    findings: list[rules.Finding] = []
    for slice_id in active_ids:
        findings.append(
            rules.Finding(
                rule="idle_slice",
                target=f"slice:{slice_id}",
                severity=rules.INFO,
                root_cause=rules.RECLAIM_FAILURE,
                title=f"Slice {slice_id} computes again",
                slice_id=slice_id,
                resolves=True,
            )
        )
    return findings


def _gpu_rows(*, gpu_ids: set[int], node_ids: set[int]) -> dict[int, GpuRow]:
    if not gpu_ids and not node_ids:
        return {}
    return {
        row[0]: GpuRow(*row)
        for row in Gpu.objects.filter(
            Q(pk__in=gpu_ids) | Q(node_id__in=node_ids, present=True)
        ).values_list(
            "pk",
            "node_id",
            "index",
            "uuid",
            "accepting_placements",
            "pci_bus_id",
            "node__name",
            "not_accepting_reason",
        )
    }


def _process_rules(
    procs: list[rules.ProcessView], owners: dict[str, rules.SliceView], th: rules.Thresholds
) -> list[rules.Finding]:
    """Jumps per process; bandwidth once per slice, judged on its busiest process."""
    out: list[rules.Finding] = []
    busiest: dict[str, rules.ProcessView] = {}
    for p in procs:
        owner = owners.get(p.container_id)
        if owner is None:
            continue  # processes of no running slice are the sweep's orphans
        out += rules.process_jump(p, th, owner=owner)
        if p.memory_utilization is not None:
            top = busiest.get(p.container_id)
            if top is None or p.memory_utilization > (top.memory_utilization or 0):
                busiest[p.container_id] = p
    for cid, p in busiest.items():
        out += rules.bandwidth(p, th, owner=owners[cid])
    return out


@dataclass(frozen=True, slots=True)
class GpuRow:
    """What the per-batch rules need of a GPU (plain rows: no model instances)."""

    pk: int
    node_id: int
    index: int
    uuid: str
    accepting_placements: bool
    pci_bus_id: str
    node_name: str
    not_accepting_reason: str

    @property
    def label(self) -> str:
        """How the card is named, as Gpu.label names it ("gpu-host-1 GPU 3")."""
        return f"{self.node_name} GPU {self.index}"


def _previous_process_readings(containers: set[str], now: datetime) -> dict[tuple[int, int], int]:
    """Each of these containers' processes' reading one sample before this batch."""
    since = now - timedelta(seconds=3 * settings.NODES_SAMPLE_INTERVAL)
    out: dict[tuple[int, int], int] = {}
    rows = (
        ProcessSample.objects.filter(
            container_id__in=containers,
            taken_at__lt=now,
            taken_at__gte=since,
        )
        .order_by("taken_at")
        .values_list("gpu_id", "pid", "used_memory_mb")
    )
    for gpu_id, pid, used in rows:
        out[(gpu_id, pid)] = used  # ordered by time: the latest wins
    return out


def slice_watches_ensure(*, slice_ids: list[int]) -> dict[int, SliceWatch]:
    """The watch rows of these slices, each made where it is missing (by slice id)."""
    watches = {w.slice_id: w for w in SliceWatch.objects.filter(slice_id__in=slice_ids)}
    for pk in slice_ids:
        if pk not in watches:
            watches[pk] = SliceWatch.objects.get_or_create(slice_id=pk)[0]
    return watches


def _remember_slice(watch: SliceWatch, *, streak: int, drift: int) -> None:
    if (watch.over_quota_streak, watch.drift_streak) != (streak, drift):
        watch.over_quota_streak, watch.drift_streak = streak, drift
        watch.save(update_fields=["over_quota_streak", "drift_streak"])


def _xids_by_gpu(batch: SampleBatch, gpus: dict[int, GpuRow]) -> dict[int, list[tuple[int, str]]]:
    by_bus = {(g.node_id, _bus(g.pci_bus_id)): g.pk for g in gpus.values() if g.pci_bus_id}
    out: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for node_id, sample in batch.samples.items():
        for x in sample.xid_events:
            gpu_id = by_bus.get((node_id, _bus(x.pci_bus_id or "")))
            if gpu_id is not None:
                out[gpu_id].append((x.xid, x.raw))
    return out


def _bus(pci: str) -> tuple[int, int, int] | str:
    """'00000009:3B:00.0' and 'PCI:0009:3b:00' name the same device: (domain, bus,
    device), the domain included (multi-segment hosts repeat bus numbers)."""
    text = pci.lower().removeprefix("pci:")
    parts = text.split(":")
    try:
        if len(parts) == 3:
            domain, bus, dev = parts
        elif len(parts) == 2:
            domain, (bus, dev) = "0", parts
        else:
            return text
        return (int(domain, 16), int(bus, 16), int(dev.split(".")[0], 16))
    except ValueError:
        return text


# --- acting on findings ----------------------------------------------------------------------


def _open_keys() -> dict[tuple[str, str], tuple[int, str]]:
    """(rule, target) -> (id, severity) of every open incident: they are few fleet-wide,
    so one read replaces a lookup per finding."""
    return {
        (rule, target): (pk, severity)
        for rule, target, pk, severity in Incident.objects.open().values_list(
            "rule", "target_key", "pk", "severity"
        )
    }


def findings_apply(
    *,
    findings: list[rules.Finding],
    now: datetime,
    gpus: Mapping[int, Gpu | GpuRow] | None = None,
    open_keys: dict[tuple[str, str], tuple[int, str]] | None = None,
) -> dict[str, int]:
    """Incidents for the findings, then their actions: placement changes inline, node
    work on the incidents queue after commit. Resolving findings close what cleared."""
    counts = {"opened": 0, "repeated": 0, "resolved": 0, "actions": 0}
    if open_keys is None:
        open_keys = _open_keys()
    repeats: list[int] = []
    for f in findings:
        known = open_keys.get(f.key)
        if (
            known is not None
            and not f.resolves
            and not f.action
            and SEVERITY_RANK[f.severity] <= SEVERITY_RANK.get(known[1], 0)
        ):
            # The same condition again, nothing to do: counted in one UPDATE below (a
            # well-packed fleet keeps many cards at 86-90%, every sample).
            repeats.append(known[0])
            continue
        try:
            _apply_one(f, now=now, gpus=gpus or {}, open_keys=open_keys, counts=counts)
        except Exception:
            # One bad finding must not cost the others their incident or their action.
            logger.exception("watchdog: finding %s on %s failed", f.rule, f.target)
    if repeats:
        counts["repeated"] += (
            Incident.objects.open()
            .filter(pk__in=repeats)
            .update(
                occurrences=F("occurrences") + 1, last_seen_at=Greatest("last_seen_at", Value(now))
            )
        )
    return counts


def _apply_one(
    f: rules.Finding,
    *,
    now: datetime,
    gpus: Mapping[int, Gpu | GpuRow],
    open_keys: dict[tuple[str, str], tuple[int, str]],
    counts: dict[str, int],
) -> None:
    if f.resolves:
        if f.key not in open_keys and f.action not in (rules.OPEN_GPU, rules.UNTHROTTLE):
            return  # nothing open: the common, healthy case costs no query
        with transaction.atomic():
            if incident_clear(finding=f, now=now):
                counts["resolved"] += 1
            if f.action:
                finding_act(finding=f, incident=None, now=now)
                counts["actions"] += 1
        return
    with transaction.atomic():
        incident, created = incident_record(finding=f, now=now, context=lambda: _context(f, gpus))
        counts["opened" if created else "repeated"] += 1
        if f.action and (f.action not in ONE_SHOT_ACTIONS or _first_time(incident, f.action)):
            finding_act(finding=f, incident=incident, now=now)
            counts["actions"] += 1
        elif created and f.rule == "oom_exit":
            # Reconcile already disposed of it: the slice failed alone, its VRAM was
            # released and metering stopped. The ledger records that, and archives it.
            incident_mitigate(
                incident=incident,
                message="The container ended alone; reconcile failed its slice, released "
                "its VRAM and stopped metering. Neighbours were not touched.",
            )
            incident_resolve_locked(
                incident=incident,
                actor=None,
                note="Disposed by reconcile: the slice failed alone.",
                now=now,
            )
        if created:
            incident_notify(incident=incident, event="opened")


def _first_time(incident: Incident, action: str) -> bool:
    """Record that `action` was taken for this incident; False if it already was."""
    if incident.events.filter(kind=E.ACTION, data__requested=action).exists():
        return False
    incident_event(
        incident=incident,
        kind=E.ACTION,
        message=f"Action requested: {action}.",
        data={"requested": action},
    )
    return True


def _context(f: rules.Finding, gpus: Mapping[int, Gpu | GpuRow]) -> IncidentContext:
    gpu = gpus.get(f.gpu_id) if f.gpu_id else None
    if gpu is None and f.gpu_id:  # a quiet card the batch did not read: read it now
        gpu = _gpu_rows(gpu_ids={f.gpu_id}, node_ids=set()).get(f.gpu_id)
    out: IncidentContext = {}
    if gpu is not None:
        out["gpu_name"] = gpu.label
        out["node_name"] = gpu.node_name if isinstance(gpu, GpuRow) else gpu.node.name
    if f.slice_id:
        s = Slice.objects.filter(pk=f.slice_id).select_related("tenant", "allocation__gpu").first()
        if s is not None:
            out["tenant_name"] = s.tenant.name
            out["evidence"] = {
                "slice": _slice_evidence(s),
                "processes": _process_list(f.gpu_id, s.container_id),
            }
    elif f.gpu_id:
        out["evidence"] = {"processes": _process_list(f.gpu_id, None)}
    if f.gpu_id:
        out.setdefault("evidence", {})["window"] = _window(f.gpu_id)
    return out


def _slice_evidence(s: Slice) -> dict[str, Any]:
    """The slice as the incident froze it, with the quota the rules held it to."""
    quota = allocation_quota(s.allocation, tier_mb=s.vram_mb)
    out: dict[str, Any] = {
        "id": s.pk,
        "image": s.image,
        "tenant": s.tenant.name,
        "quota_mb": quota.mb,
        "tier_mb": s.vram_mb,
        "container_id": s.container_id,
    }
    if quota.instance is not None:
        out["mig_instance"] = {
            "profile": quota.instance.profile,
            "memory_mb": quota.instance.memory_mb,
        }
    return out


def _process_list(gpu_id: int | None, container_id: str | None) -> list[dict[str, Any]]:
    """The processes of the latest sample on the GPU (PID, MiB, container), frozen."""
    if gpu_id is None:
        return []
    samples = ProcessSample.objects.filter(gpu_id=gpu_id)
    if container_id:  # the last sample that still showed it (it may be gone now)
        samples = samples.filter(container_id=container_id)
    latest = samples.order_by("-taken_at").values_list("taken_at", flat=True).first()
    if latest is None:
        return []
    rows = ProcessSample.objects.filter(gpu_id=gpu_id, taken_at=latest)
    if container_id:
        rows = rows.filter(container_id=container_id)
    return [
        {"pid": p.pid, "used_mb": p.used_memory_mb, "container_id": p.container_id}
        for p in rows[:50]
    ]


def _window(gpu_id: int, minutes: int = 10) -> list[list[str | int]]:
    since = timezone.now() - timedelta(minutes=minutes)
    return [
        [t.isoformat(), used]
        for t, used in GpuSample.objects.filter(gpu_id=gpu_id, taken_at__gte=since)
        .order_by("taken_at")
        .values_list("taken_at", "memory_used_mb")[:200]
    ]
