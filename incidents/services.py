"""The watchdog and the incident ledger: every write about incidents.

`watch_batch` runs on each stored batch of samples (a nodes sample hook, in the telemetry
worker, right after the batch commits) and `watch_sweep` every minute over the recent
window. Both turn rule findings (incidents.rules) into deduplicated incidents with the
runbook's five steps on their timeline, and act on the offender alone: placement
changes happen inline; anything that talks to a node (stopping a container, ending an
orphan, throttling) goes to the `incidents` queue after commit.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from nodes import services as node_services
from nodes.hooks import SampleBatch
from nodes.models import Allocation, Gpu, GpuSample, Node, ProcessSample
from tenants.models import Slice

from . import rules
from .models import GpuWatch, Incident, IncidentEvent, IncidentSlice, SliceWatch, Thresholds
from .notify import TENANT_ADVICE

logger = logging.getLogger(__name__)

E = IncidentEvent.Kind
BREAKER_REASON = "VRAM breaker"
HARDWARE_REASON = "Hardware fault"  # the GPU stays drained while its reason says so
SEVERITY_RANK = {rules.INFO: 0, rules.WARNING: 1, rules.CRITICAL: 2}
LIVE = (Slice.State.PROVISIONING, Slice.State.RUNNING, Slice.State.STOPPING)
# Actions that talk to a node: done by a task on the incidents queue.
REMOTE_ACTIONS = (rules.STOP_SLICE, rules.END_ORPHAN, rules.THROTTLE)
# Done once per incident, not again on every repeat of the finding (a stop is asked for
# again while the slice still runs: its task is idempotent, and a lost one is retried).
ONE_SHOT_ACTIONS = (rules.NOTIFY_TENANTS, rules.DRAIN_GPU, rules.END_ORPHAN)


# --- the ledger -------------------------------------------------------------------------------


def incident_event(
    incident: Incident,
    kind: str,
    message: str,
    *,
    actor: AbstractBaseUser | None = None,
    data: dict | None = None,
) -> IncidentEvent:
    return IncidentEvent.objects.create(
        incident=incident,
        kind=kind,
        message=message[:500],
        actor=actor if actor is not None and actor.is_authenticated else None,
        data=data or {},
    )


def _located(f: rules.Finding, context: dict) -> str:
    parts = []
    ev = f.evidence
    if "pid" in ev:
        parts.append(f"PID {ev['pid']}")
    if ev.get("container_id"):
        parts.append(f"container {str(ev['container_id'])[:12]}")
    if f.slice_id:
        parts.append(f"slice {f.slice_id}")
    if context.get("tenant_name"):
        parts.append(f"tenant {context['tenant_name']}")
    if context.get("gpu_name"):
        parts.append(context["gpu_name"])
    elif context.get("node_name"):
        parts.append(f"node {context['node_name']}")
    return ", ".join(parts) or "the fleet"


def incident_record(
    *, finding: rules.Finding, now: datetime, context: dict | Callable[[], dict] | None = None
) -> tuple[Incident, bool]:
    """Open an incident for the finding, or count another occurrence of the open one
    (one per rule and target). A new one gets the runbook's first three steps; its
    context (names, frozen evidence) is only gathered then: `context` may be a callable."""
    open_one = (
        Incident.objects.open()
        .select_for_update()
        .filter(rule=finding.rule, target_key=finding.target)
        .first()
    )
    if open_one is not None:
        open_one.occurrences += 1
        open_one.last_seen_at = max(open_one.last_seen_at, now)  # sweeps may overlap
        fields = ["occurrences", "last_seen_at"]
        if SEVERITY_RANK[finding.severity] > SEVERITY_RANK.get(open_one.severity, 0):
            open_one.severity = finding.severity
            open_one.title = finding.title[:200]
            fields += ["severity", "title"]
            incident_event(open_one, E.NOTE, f"Escalated to {finding.severity}: {finding.title}")
            open_one.save(update_fields=fields)
            from .notify import incident_notify

            incident_notify(incident=open_one, event="escalated")
            return open_one, False
        open_one.save(update_fields=fields)
        return open_one, False
    context = (context() if callable(context) else context) or {}
    since = finding.evidence.get("since_epoch")
    evidence = {
        **finding.evidence,
        "detail": finding.detail,
        "detected_at": now.isoformat(),
        # when the condition began, as far as the samples show: time to detect
        "condition_since": (
            datetime.fromtimestamp(since, tz=UTC).isoformat() if since else now.isoformat()
        ),
        **context.get("evidence", {}),
    }
    try:
        with transaction.atomic():
            incident = Incident.objects.create(
                rule=finding.rule,
                target_key=finding.target[:200],
                title=finding.title[:200],
                root_cause=finding.root_cause,
                severity=finding.severity,
                tenant_id=finding.tenant_id,
                node_id=finding.node_id,
                gpu_id=finding.gpu_id,
                slice_id=finding.slice_id,
                evidence=evidence,
                first_seen_at=now,
                last_seen_at=now,
            )
    except IntegrityError:  # another worker opened it a moment ago: count this one
        return incident_record(finding=finding, now=now, context=context)
    incident_event(incident, E.DETECTED, finding.title, data={"rule": finding.rule})
    incident_event(incident, E.LOCATED, f"Located: {_located(finding, context)}.")
    incident_event(
        incident,
        E.CLASSIFIED,
        f"Classified: {Incident.RootCause(finding.root_cause).label}.",
        data={"root_cause": finding.root_cause},
    )
    return incident, True


def incident_clear(*, finding: rules.Finding, now: datetime, note: str = "") -> Incident | None:
    """The condition is gone: the system resolves the open incident and archives it."""
    incident = (
        Incident.objects.open()
        .select_for_update()
        .filter(rule=finding.rule, target_key=finding.target)
        .first()
    )
    if incident is None:
        return None
    _resolve(incident, None, note or f"Condition cleared: {finding.title}.", now)
    return incident


def _resolve(incident: Incident, actor, note: str, now: datetime) -> None:  # type: ignore[no-untyped-def]
    incident.status = Incident.Status.RESOLVED
    incident.resolved_at = now
    incident.resolved_by = actor if actor is not None and actor.is_authenticated else None
    incident.resolution_note = note[:2000]
    incident.save(update_fields=["status", "resolved_at", "resolved_by", "resolution_note"])
    incident_event(incident, E.STATUS, f"Resolved: {note}"[:500], actor=actor)
    incident_event(incident, E.ARCHIVED, _archive_line(incident), actor=actor)
    if actor is not None or incident.severity == Incident.Severity.CRITICAL or incident.slice_id:
        # Who was told it started is told it ended (a warning that clears itself is not).
        from .notify import incident_notify

        incident_notify(incident=incident, event="resolved")


def _archive_line(incident: Incident) -> str:
    """Step five: tenant account, task, time, symptom and disposition, in one line."""
    disposed = (
        incident.events.filter(kind=E.DISPOSED).order_by("-at").values_list("message", flat=True)
    ).first()
    who = incident.tenant.name if incident.tenant_id else "no tenant"
    task = f"slice {incident.slice_id}" if incident.slice_id else incident.target_key
    return (
        f"Archived: {who}; {task}; {incident.first_seen_at:%Y-%m-%d %H:%M:%S} UTC; "
        f"{incident.title}; {disposed or 'no action needed'}."
    )[:500]


def _require_ops(actor: AbstractBaseUser) -> None:
    if not getattr(actor, "is_staff", False):
        raise NotAllowed("Only ops manage incidents.")


@transaction.atomic
def incident_acknowledge(*, incident: Incident, actor: AbstractBaseUser) -> Incident:
    _require_ops(actor)
    incident = Incident.objects.select_for_update().get(pk=incident.pk)
    if incident.status == Incident.Status.RESOLVED:
        raise Conflict("This incident is resolved; reopen it first.", code="resolved")
    if incident.status == Incident.Status.OPEN:
        incident.status = Incident.Status.ACKNOWLEDGED
        incident.acknowledged_by = actor
        incident.acknowledged_at = timezone.now()
        incident.save(update_fields=["status", "acknowledged_by", "acknowledged_at"])
        incident_event(incident, E.STATUS, "Acknowledged.", actor=actor)
    return incident


def incidents_acknowledge(*, ids: list[int], actor: AbstractBaseUser) -> int:
    """Bulk acknowledge; resolved ones and ids that do not exist are skipped."""
    _require_ops(actor)
    done = 0
    for pk in Incident.objects.filter(pk__in=ids, status=Incident.Status.OPEN).values_list(
        "pk", flat=True
    ):
        try:
            incident = incident_acknowledge(incident=Incident(pk=pk), actor=actor)
        except Conflict:
            continue  # resolved meanwhile
        if incident.acknowledged_by_id == actor.pk:
            done += 1
    return done


@transaction.atomic
def incident_resolve(*, incident: Incident, actor: AbstractBaseUser, note: str) -> Incident:
    _require_ops(actor)
    note = (note or "").strip()
    if not note:
        raise ServiceError("Say how it was resolved.", field="note")
    incident = Incident.objects.select_for_update().get(pk=incident.pk)
    if incident.status == Incident.Status.RESOLVED:
        return incident
    _resolve(incident, actor, note, timezone.now())
    return incident


@transaction.atomic
def incident_reopen(*, incident: Incident, actor: AbstractBaseUser, note: str = "") -> Incident:
    _require_ops(actor)
    incident = Incident.objects.select_for_update().get(pk=incident.pk)
    if incident.status != Incident.Status.RESOLVED:
        return incident
    if Incident.objects.open().filter(rule=incident.rule, target_key=incident.target_key).exists():
        raise Conflict(
            "A newer incident for this rule and target is open: work on that one.",
            code="newer_incident_open",
        )
    incident.status = Incident.Status.ACKNOWLEDGED
    incident.resolved_at = None
    incident.resolved_by = None
    incident.resolution_note = ""  # the old note stays in the timeline
    incident.acknowledged_by = actor
    incident.acknowledged_at = timezone.now()
    incident.save(
        update_fields=[
            "status",
            "resolved_at",
            "resolved_by",
            "resolution_note",
            "acknowledged_by",
            "acknowledged_at",
        ]
    )
    incident_event(incident, E.STATUS, f"Reopened. {note}".strip(), actor=actor)
    from .notify import incident_notify

    incident_notify(incident=incident, event="reopened")
    return incident


@transaction.atomic
def incident_confirm_orphan(*, incident: Incident, actor: AbstractBaseUser) -> Incident:
    """Ops confirm an orphan (a process or container of no slice): it is ended now."""
    _require_ops(actor)
    incident = Incident.objects.select_for_update().get(pk=incident.pk)
    if incident.rule != "orphan_process" or incident.gpu_id is None:
        raise Conflict("Only an orphan process can be ended from here.", code="not_an_orphan")
    if incident.status == Incident.Status.RESOLVED:
        raise Conflict("This incident is resolved.", code="resolved")
    incident_event(incident, E.ACTION, "Ops confirmed the orphan: ending it.", actor=actor)
    from .tasks import dispose

    dispose.delay_on_commit(incident.pk, rules.END_ORPHAN, incident.evidence)
    return incident


def _mitigated(incident: Incident, message: str, *, actor=None, data=None, tell=False) -> None:  # type: ignore[no-untyped-def]
    """Record a disposal; `tell`: one done later than the alarm (a stop by the worker),
    which ops are told of as its own event (an action taken as the incident opens is
    in the alarm's mail already)."""
    if incident.status in (Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED):
        incident.status = Incident.Status.MITIGATED
        incident.save(update_fields=["status"])
    incident_event(incident, E.DISPOSED, message, actor=actor, data=data)
    if tell:
        from .notify import incident_notify

        incident_notify(incident=incident, event="action")


@transaction.atomic
def thresholds_update(*, actor: AbstractBaseUser, **changes: Any) -> Thresholds:
    _require_ops(actor)
    row = Thresholds.current()
    row = Thresholds.objects.select_for_update().get(pk=row.pk)
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


def watch_batch(batch: SampleBatch) -> dict[str, int]:
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
    procs_by_gpu: dict[int, list[rules.ProcessView]] = defaultdict(list)
    slices, slice_watches, known = _live_slices(node_ids=node_ids)
    # Jumps are judged for processes of running slices (the rest are the sweep's orphans):
    # the previous readings are fetched for those containers only.
    previous = _previous_process_readings({r["cid"] for r in slices}, now) if slices else {}
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
    readings = {
        g.uuid: g
        for sample in batch.samples.values()
        for g in sample.gpus
        if g.ecc_uncorrected_volatile or g.remapped_rows_failure
    }
    with_xids = {node_id for node_id, sample in batch.samples.items() if sample.xid_events}
    quiet_below = th.vram_warning_pct - rules.CLEAR_MARGIN_PCT
    open_keys = _open_keys()
    flagged = {key[1] for key in open_keys}  # targets with an open incident
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
    # The common case on a healthy fleet is that no card needs a card-level rule: the
    # GPU rows are read only for those that do (and for nodes that reported an Xid).
    gpus = _gpu_rows(
        gpu_ids={r.gpu_id for r in loud},
        node_ids=with_xids,
    )
    xids = _xids_by_gpu(batch, gpus)
    loud += [r for r in batch.gpu_samples if r.gpu_id in xids and r not in loud]
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
    # A card that fell off the bus (Xid 79) is gone from NVML: its Xid comes from the
    # kernel log with no reading of the card beside it. It is drained all the same.
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
    for slice_id in active_ids:  # computing again: an idle incident has cleared
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
    return apply_findings(findings, now=now, gpus=gpus, open_keys=open_keys)


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


class GpuRow(NamedTuple):
    """What the per-batch rules need of a GPU (plain rows: no model instances)."""

    pk: int
    node_id: int
    index: int
    uuid: str
    accepting_placements: bool
    pci_bus_id: str
    node_name: str
    not_accepting_reason: str


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


def _live_slices(*, node_ids: list[int] | None = None):  # type: ignore[no-untyped-def]
    """Running slices on these nodes (all, for None) with their watch rows, and every
    container a live slice owns there (processes in them are nobody's orphans)."""
    live = Slice.objects.filter(state__in=LIVE)
    if node_ids is not None:
        live = live.filter(allocation__gpu__node_id__in=node_ids)
    rows = list(
        live.values(
            "pk",
            "state",
            "tenant_id",
            "vram_mb",
            "container_id",
            "allocation__gpu_id",
            "allocation__gpu__node_id",
            "allocation__mig_device_uuid",
        )
    )
    known = {r["container_id"] for r in rows if r["container_id"]}
    running = [
        {
            "pk": r["pk"],
            "tenant_id": r["tenant_id"],
            "quota": r["vram_mb"],
            "cid": r["container_id"],
            "gpu_id": r["allocation__gpu_id"],
            "node_id": r["allocation__gpu__node_id"],
            "mig": bool(r["allocation__mig_device_uuid"]),
        }
        for r in rows
        if r["state"] == Slice.State.RUNNING and r["container_id"]
    ]
    watches = {
        w.slice_id: w for w in SliceWatch.objects.filter(slice_id__in=[r["pk"] for r in running])
    }
    for r in running:
        if r["pk"] not in watches:
            watches[r["pk"]] = SliceWatch.objects.get_or_create(slice_id=r["pk"])[0]
    return running, watches, known


def _remember_slice(watch: SliceWatch, *, streak: int, drift: int) -> None:
    if (watch.over_quota_streak, watch.drift_streak) != (streak, drift):
        watch.over_quota_streak, watch.drift_streak = streak, drift
        watch.save(update_fields=["over_quota_streak", "drift_streak"])


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


def apply_findings(
    findings: list[rules.Finding],
    *,
    now: datetime,
    gpus: dict[int, Gpu] | None = None,
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


def _apply_one(f: rules.Finding, *, now, gpus, open_keys, counts) -> None:  # type: ignore[no-untyped-def]
    if f.resolves:
        if f.key not in open_keys and f.action not in (rules.OPEN_GPU, rules.UNTHROTTLE):
            return  # nothing open: the common, healthy case costs no query
        with transaction.atomic():
            if incident_clear(finding=f, now=now):
                counts["resolved"] += 1
            if f.action:
                _act(None, f, now)
                counts["actions"] += 1
        return
    with transaction.atomic():
        incident, created = incident_record(
            finding=f, now=now, context=lambda f=f: _context(f, gpus)
        )
        counts["opened" if created else "repeated"] += 1
        if f.action and (f.action not in ONE_SHOT_ACTIONS or _first_time(incident, f.action)):
            _act(incident, f, now)
            counts["actions"] += 1
        elif created and f.rule == "oom_exit":
            # Reconcile already disposed of it: the slice failed alone, its VRAM was
            # released and metering stopped. The ledger records that, and archives it.
            _mitigated(
                incident,
                "The container ended alone; reconcile failed its slice, released its "
                "VRAM and stopped metering. Neighbours were not touched.",
            )
            _resolve(incident, None, "Disposed by reconcile: the slice failed alone.", now)
        if created:
            from .notify import incident_notify

            incident_notify(incident=incident, event="opened")


def _first_time(incident: Incident, action: str) -> bool:
    """Record that `action` was taken for this incident; False if it already was."""
    if incident.events.filter(kind=E.ACTION, data__requested=action).exists():
        return False
    incident_event(incident, E.ACTION, f"Action requested: {action}.", data={"requested": action})
    return True


def _context(f: rules.Finding, gpus: dict[int, Gpu]) -> dict:
    gpu = gpus.get(f.gpu_id) if f.gpu_id else None
    if gpu is None and f.gpu_id:  # a quiet card the batch did not read: read it now
        gpu = _gpu_rows(gpu_ids={f.gpu_id}, node_ids=set()).get(f.gpu_id)
    out: dict[str, Any] = {}
    if gpu is not None:
        node_name = getattr(gpu, "node_name", None) or gpu.node.name
        out["gpu_name"] = f"{node_name} GPU {gpu.index}"
        out["node_name"] = node_name
    if f.slice_id:
        s = Slice.objects.filter(pk=f.slice_id).select_related("tenant").first()
        if s is not None:
            out["tenant_name"] = s.tenant.name
            out["evidence"] = {
                "slice": {
                    "id": s.pk,
                    "image": s.image,
                    "tenant": s.tenant.name,
                    "quota_mb": s.vram_mb,
                    "container_id": s.container_id,
                },
                "processes": _process_list(f.gpu_id, s.container_id),
            }
    elif f.gpu_id:
        out["evidence"] = {"processes": _process_list(f.gpu_id, None)}
    if f.gpu_id:
        out.setdefault("evidence", {})["window"] = _window(f.gpu_id)
    return out


def _process_list(gpu_id: int | None, container_id: str | None) -> list[dict]:
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


def _window(gpu_id: int, minutes: int = 10) -> list[list]:
    since = timezone.now() - timedelta(minutes=minutes)
    return [
        [t.isoformat(), used]
        for t, used in GpuSample.objects.filter(gpu_id=gpu_id, taken_at__gte=since)
        .order_by("taken_at")
        .values_list("taken_at", "memory_used_mb")[:200]
    ]


def _act(incident: Incident | None, f: rules.Finding, now: datetime) -> None:
    """Carry out a finding's action (inside the caller's transaction)."""
    if f.action == rules.CLOSE_GPU and f.gpu_id:
        gpu = Gpu.objects.get(pk=f.gpu_id)
        if gpu.accepting_placements:  # closed already (ops, a fault): keep their reason
            node_services.gpu_set_accepting(
                gpu=gpu,
                accepting=False,
                reason=f"{BREAKER_REASON}: {f.evidence.get('percent')}% used",
            )
        GpuWatch.objects.update_or_create(gpu=gpu, defaults={"breaker_open": True})
        if incident:
            _mitigated(incident, "GPU closed to new placements (running work continues).")
    elif f.action == rules.OPEN_GPU and f.gpu_id:
        watch = GpuWatch.objects.filter(gpu_id=f.gpu_id).first()
        if watch is not None and watch.breaker_open:
            watch.breaker_open = False
            watch.save(update_fields=["breaker_open"])
            gpu = Gpu.objects.get(pk=f.gpu_id)
            # Reopen only what the breaker closed: an ops or hardware closure stays.
            if gpu.not_accepting_reason.startswith(BREAKER_REASON):
                node_services.gpu_set_accepting(gpu=gpu, accepting=True)
    elif f.action == rules.DRAIN_GPU and f.gpu_id:
        gpu = Gpu.objects.get(pk=f.gpu_id)
        node_services.gpu_set_accepting(gpu=gpu, accepting=False, reason=f.title)
        if incident:
            _mitigated(incident, "GPU drained: it takes no new slice; its tenants were told.")
        _tell_tenants_on(
            gpu_ids=[gpu.pk],
            incident=incident,
            subject="A GPU your slice runs on has a fault",
            body=TENANT_ADVICE["hardware_fault"],
        )
    elif f.action == rules.NOTIFY_TENANTS and f.node_id:
        ids = list(Gpu.objects.filter(node_id=f.node_id).values_list("pk", flat=True))
        _tell_tenants_on(
            gpu_ids=ids,
            incident=incident,
            subject="The machine your slice runs on does not answer",
            body=TENANT_ADVICE["node_unreachable"],
        )
        if incident:
            incident_event(incident, E.ACTION, "Tenants on the node were told.")
    elif f.action == rules.WARN_IDLE and f.slice_id:
        SliceWatch.objects.update_or_create(slice_id=f.slice_id, defaults={"idle_warned_at": now})
        s = Slice.objects.select_related("tenant").get(pk=f.slice_id)
        from tenants.services import members_notify

        members_notify(tenant=s.tenant, subject=f"Slice {s.pk} is idle", body=f.detail)
        if incident:
            incident_event(incident, E.ACTION, "Tenant warned: idle slices are reclaimed.")
        from .tasks import idle_due

        # the stop when it is due (the minute's sweep would come up to a minute late)
        due = Thresholds.current().idle_stop_after_s
        transaction.on_commit(lambda: idle_due.apply_async((f.slice_id,), countdown=due))
    elif f.action in REMOTE_ACTIONS and incident is not None:
        if f.action == rules.THROTTLE and f.slice_id:
            SliceWatch.objects.update_or_create(slice_id=f.slice_id, defaults={"throttled_at": now})
        from .tasks import dispose

        dispose.delay_on_commit(incident.pk, f.action, f.evidence)
    elif f.action == rules.UNTHROTTLE and f.slice_id:
        SliceWatch.objects.filter(slice_id=f.slice_id).update(throttled_at=None)
        from .tasks import release_throttle

        release_throttle.delay_on_commit(f.slice_id)


def _tell_tenants_on(
    *, gpu_ids: list[int], incident: Incident | None, subject: str, body: str
) -> None:
    """Mail the tenants of the live slices on these GPUs, and record those slices on the
    incident so that their tenants find it on their incident page."""
    from tenants.services import members_notify

    touched = list(
        Slice.objects.filter(allocation__gpu_id__in=gpu_ids, state__in=LIVE)
        .select_related("tenant")
        .order_by("pk")
    )
    if incident is not None:
        IncidentSlice.objects.bulk_create(
            [IncidentSlice(incident=incident, slice=s, tenant_id=s.tenant_id) for s in touched],
            ignore_conflicts=True,
        )
    for tenant in {s.tenant_id: s.tenant for s in touched}.values():
        members_notify(tenant=tenant, subject=subject, body=body)


# --- node work, on the incidents queue ---------------------------------------------------------


def incident_dispose(*, incident_id: int, action: str, evidence: dict) -> str:
    """Stop the offending slice's container, end an orphan, or throttle: the offender
    alone. Safe to run twice (a stopped slice is not stopped again)."""
    incident = Incident.objects.select_related("slice", "gpu__node").get(pk=incident_id)
    if action == rules.STOP_SLICE and incident.slice_id:
        return _stop_offender(incident, evidence)
    if action == rules.END_ORPHAN and incident.gpu_id:
        return _end_orphan(incident, evidence)
    if action in (rules.THROTTLE, rules.UNTHROTTLE) and incident.slice_id:
        from .throttle import throttle_slice

        return throttle_slice(incident=incident, action=action)
    return "nothing to do"


def _stop_offender(incident: Incident, evidence: dict | None = None) -> str:
    from tenants import services as tenant_services

    s = incident.slice
    if s is None or s.is_final:
        return "already stopped"
    reason = _stop_reason(incident, evidence or {})
    if s.state != Slice.State.STOPPING:
        tenant_services.slice_stop(slice=s, actor=None, reason=reason, force=True)
    # A retry finds it stopping: finish removing the container (raising if the node
    # will not), never release the VRAM while the offender may still hold it.
    state = tenant_services.slice_finish_stop(slice_id=s.pk, force=True)
    with transaction.atomic():
        incident = Incident.objects.select_for_update().get(pk=incident.pk)
        _mitigated(
            incident,
            f"Stopped slice {s.pk}'s container alone and released its VRAM; metering stopped.",
            data={"slice_state": state},
            tell=True,
        )
        if state in (Slice.State.STOPPED, Slice.State.FAILED):
            _resolve(incident, None, "Disposed: the offending slice was stopped.", timezone.now())
    from tenants.services import members_notify

    members_notify(tenant=s.tenant, subject=f"Slice {s.pk} was stopped", body=reason)
    return state


def _stop_reason(incident: Incident, evidence: dict) -> str:
    """Why the watchdog stopped it, from the finding that stopped it (the incident's own
    evidence is what was seen when it opened)."""
    ev = {**incident.evidence, **evidence}
    if incident.rule == "quota_breach":
        return (
            f"Stopped by the watchdog: its processes used {ev.get('used_mb')} MiB of a "
            f"{ev.get('quota_mb')} MiB quota. Lower the batch size or context, quantize "
            "the model, or buy a bigger tier."
        )
    if incident.rule == "idle_slice":
        return (
            f"Stopped by the watchdog: no compute for {rules.duration(ev.get('idle_s', 0))}, "
            "so its memory was released for others. Launch again when you need it."
        )
    return f"Stopped by the watchdog: {incident.title}."


def _end_orphan(incident: Incident, evidence: dict) -> str:
    """End an orphan only if it is the platform's own container with no live slice, as
    the node shows it now; anything else (a bare PID, a container ops run themselves) is
    left for ops with the evidence: a PID may have been reused since the sample."""
    from nodes import runtime

    node = incident.gpu.node  # type: ignore[union-attr]
    container = evidence.get("container_id") or ""
    pid = evidence.get("pid")
    info = node_services.container_inspect(node=node, container=container) if container else None
    ours = info is not None and info.labels.get(runtime.LABEL_MANAGED) == "1"
    from tenants.services import owner_is_live

    owner_live = ours and owner_is_live(info.owner_key)
    if not ours or owner_live:
        with transaction.atomic():
            incident_event(
                incident,
                E.NOTE,
                "Not ended automatically: it is not a platform container without a live "
                "slice (or it is gone). Ops decide from the evidence.",
                data={"pid": pid, "container_id": container},
            )
        return "left for ops"
    node_services.container_remove(node=node, container=info.id, grace_s=0)
    done = f"Removed the platform container {info.id[:12]} holding the memory (no live slice)."
    with transaction.atomic():
        incident = Incident.objects.select_for_update().get(pk=incident.pk)
        _mitigated(incident, done, data={"pid": pid, "container_id": info.id}, tell=True)
        _resolve(incident, None, "Disposed: the orphan container was removed.", timezone.now())
    return done


# --- the sweep, every minute -------------------------------------------------------------------


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
    # what the cards' slices held within their own quotas, sample by sample
    quotas = dict(
        Allocation.objects.filter(gpu_id__in=list(series))
        .exclude(container_id="")
        .filter(Q(released_at__isnull=True) | Q(released_at__gte=since))
        .values_list("container_id", "vram_mb")
    )
    held: dict[tuple[int, float, str], int] = defaultdict(int)
    for gpu_id, t, container, used in ProcessSample.objects.filter(
        gpu_id__in=list(series), container_id__in=list(quotas), taken_at__gte=since
    ).values_list("gpu_id", "taken_at", "container_id", "used_memory_mb"):
        held[gpu_id, t.timestamp(), container] += used
    in_quota: dict[int, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for (gpu_id, t, container), used in held.items():
        in_quota[gpu_id][t] += min(used, quotas[container])
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
    counts = apply_findings(findings, now=now, gpus=gpus)
    counts["expired"] = _expire_quiet(now)
    return counts


# Rules whose condition has no clear "back to normal" reading: their incident closes
# once it has not been seen for this long (a recurrence later opens a new one).
QUIET_RULES = ("process_jump", "slow_leak", "orphan_process", "unattributed_memory")
QUIET_AFTER = timedelta(minutes=30)


def _expire_quiet(now: datetime) -> int:
    done = 0
    stale = Incident.objects.open().filter(rule__in=QUIET_RULES, last_seen_at__lt=now - QUIET_AFTER)
    for pk in stale.values_list("pk", flat=True):
        with transaction.atomic():
            incident = Incident.objects.select_for_update().get(pk=pk)
            if incident.status == Incident.Status.RESOLVED:
                continue
            minutes = int(QUIET_AFTER.total_seconds() // 60)
            _resolve(incident, None, f"Not seen for {minutes} minutes.", now)
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
    _, _, known = _live_slices()
    # A card's latest sample may be older than a slice's end: its processes were the
    # slice's when the sample was taken. Judge each sample against the slices live then.
    unknown = {cid for _, _, _, cid in latest if cid and cid not in known}
    ended, lasts = {}, {}
    for cid, stopped, pk, tenant_id in (
        Slice.objects.filter(container_id__in=unknown)
        .order_by("pk")
        .values_list("container_id", "stopped_at", "pk", "tenant_id")
        if unknown
        else []
    ):
        lasts[cid] = (pk, tenant_id)
        if stopped is not None:
            ended[cid] = stopped
    watches = {w.gpu_id: w for w in GpuWatch.objects.filter(gpu_id__in=list(gpus))}
    for gpu in gpus.values():
        if gpu.last_memory_used_mb is None or gpu.node.status != Node.Status.ACTIVE:
            continue
        if gpu.node.sample_source != "nvml":
            continue  # nvidia-smi names no container: every process would look orphaned
        watch = watches.get(gpu.pk)
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
            continue  # no new sample since the last sweep: nothing new to count
        streaks = {(gpu.pk, int(pid)): n for pid, n in (memory.get("pids") or {}).items()}
        taken = gpu.last_sample_at
        live_then = known | {cid for cid, at in ended.items() if taken and at >= taken}
        found = rules.orphans(view, procs[gpu.pk], live_then, th, streaks=streaks)
        _remember_orphans(gpu, watch, found, sample_at)
        # An orphan is an incident once it is confirmed, not at the first sight: memory
        # being freed as its container goes is no orphan.
        out += [
            _where_orphan(f, gpu, lasts)
            for f in found
            if f.rule != "orphan_process" or f.evidence["seen"] >= th.orphan_confirm_samples
        ]
    return out


def _where_orphan(f: rules.Finding, gpu: Gpu, lasts: dict[str, tuple[int, int]]) -> rules.Finding:
    """A confirmed orphan names the node, the GPU, the PID and, where the node can tell
    (the process's cgroup names a container), the container and the slice it last
    belonged to."""
    if f.rule != "orphan_process":
        return f
    cid = f.evidence.get("container_id") or ""
    last = lasts.get(cid)
    where = f"node {gpu.node.name} GPU {gpu.index}"
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
            quota_mb=s.vram_mb,
        )
        out.append((s, view))
    return out


def _idle(s: Slice, view: rules.SliceView, now: datetime, th: rules.Thresholds):  # type: ignore[no-untyped-def]
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


def slice_idle_due(*, slice_id: int, now: datetime | None = None) -> dict[str, int]:
    """The idle stop a warning scheduled for its due time: judged again now, on fresh
    telemetry (a slice that computed since the warning is left alone), so the stop comes
    when it is due, not at the next minute's sweep."""
    now = now or timezone.now()
    th = Thresholds.current().as_rules()
    findings = [
        f for s, view in _judged_slices(now, slice_ids=[slice_id]) for f in _idle(s, view, now, th)
    ]
    return apply_findings(findings, now=now) if findings else {}


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


def _sweep_gate() -> list[rules.Finding]:
    """The preflight gate's verdicts: a failed node is an incident until it passes again;
    a quota library a probe got past is one until the probes prove it again."""
    from nodes.models import GateStatus

    out = []
    for pk, name, reason in Node.objects.filter(gate_status=GateStatus.FAILED).values_list(
        "pk", "name", "gate_reason"
    ):
        out.append(rules.gate_failed(pk, name, reason))
    ineffective = set()
    for pk, name, checked in Node.objects.filter(gate_status=GateStatus.PASSED).values_list(
        "pk", "name", "preflight"
    ):
        models = sorted(m for m, state in ((checked or {}).get("quota") or {}).items()
                        if state == "ineffective")  # fmt: skip
        if models:
            ineffective.add(pk)
            out.append(rules.quota_not_effective(pk, name, models))
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
