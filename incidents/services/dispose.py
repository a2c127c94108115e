"""Acting on findings: placement changes made inline, and the node work (stopping the
offending slice, ending an orphan, throttling) done by a task on the incidents queue.

Every action touches the offender alone; the node work is safe to run twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict
from gpuplatform.ops import require_ops
from nodes import runtime
from nodes import services as node_services
from nodes.models import Gpu, Node
from tenants import services as tenant_services
from tenants.models import Slice
from tenants.selectors import owner_is_live
from tenants.services import members_notify

from .. import rules
from ..locks import incident_lock
from ..models import (
    BREAKER_REASON,
    GpuWatch,
    Incident,
    IncidentEvent,
    IncidentSlice,
    SliceWatch,
    Thresholds,
)
from ..notify import TENANT_ADVICE, incident_notify
from ..selectors import can_drain_gpu, can_drain_node, can_stop_slice, resumed_since
from .ledger import incident_event, incident_mitigate, incident_record, incident_resolve_locked
from .throttle import slice_throttle

E = IncidentEvent.Kind
# Actions that talk to a node: done by a task on the incidents queue.
REMOTE_ACTIONS = (rules.STOP_SLICE, rules.END_ORPHAN, rules.THROTTLE, rules.PREEMPT)


def finding_act(*, finding: rules.Finding, incident: Incident | None, now: datetime) -> None:
    """Carry out a finding's action (inside the caller's transaction)."""
    f = finding
    if f.action == rules.CLOSE_GPU and f.gpu_id:
        _breaker_close(incident, f, f.gpu_id)
    elif f.action == rules.OPEN_GPU and f.gpu_id:
        _breaker_reopen(f.gpu_id)
    elif f.action == rules.DRAIN_GPU and f.gpu_id:
        _drain_faulty_gpu(incident, f, f.gpu_id)
    elif f.action == rules.NOTIFY_TENANTS and f.node_id:
        _tell_node_unreachable(incident, f.node_id)
    elif f.action == rules.WARN_IDLE and f.slice_id:
        _warn_idle(incident, f, f.slice_id, now)
    elif f.action in REMOTE_ACTIONS and incident is not None:
        if f.action == rules.THROTTLE and f.slice_id:
            SliceWatch.objects.update_or_create(slice_id=f.slice_id, defaults={"throttled_at": now})
        enqueue("incidents.dispose", incident.pk, f.action, f.evidence)
    elif f.action == rules.UNTHROTTLE and f.slice_id:
        SliceWatch.objects.filter(slice_id=f.slice_id).update(throttled_at=None)
        enqueue("incidents.release_throttle", f.slice_id)


def _breaker_close(incident: Incident | None, f: rules.Finding, gpu_id: int) -> None:
    """The 95% breaker: the card takes no new placement; running work continues."""
    gpu = Gpu.objects.get(pk=gpu_id)
    if gpu.accepting_placements:  # closed already (ops, a fault): keep their reason
        node_services.gpu_set_accepting(
            gpu=gpu,
            accepting=False,
            reason=f"{BREAKER_REASON}: {f.evidence.get('percent')}% used",
        )
    GpuWatch.objects.update_or_create(gpu=gpu, defaults={"breaker_open": True})
    if incident:
        incident_mitigate(
            incident=incident, message="GPU closed to new placements (running work continues)."
        )


def _breaker_reopen(gpu_id: int) -> None:
    """The card is below the reset line: the breaker's closure lifts."""
    watch = GpuWatch.objects.filter(gpu_id=gpu_id).first()
    if watch is not None and watch.breaker_open:
        watch.breaker_open = False
        watch.save(update_fields=["breaker_open"])
        gpu = Gpu.objects.get(pk=gpu_id)
        # Reopen only what the breaker closed: an ops or hardware closure stays.
        if gpu.not_accepting_reason.startswith(BREAKER_REASON):
            node_services.gpu_set_accepting(gpu=gpu, accepting=True)


def _drain_faulty_gpu(incident: Incident | None, f: rules.Finding, gpu_id: int) -> None:
    """A hardware fault: the card takes no new slice, and its tenants are told."""
    gpu = Gpu.objects.get(pk=gpu_id)
    node_services.gpu_set_accepting(gpu=gpu, accepting=False, reason=f.title)
    if incident:
        incident_mitigate(
            incident=incident,
            message="GPU drained: it takes no new slice; its tenants were told.",
        )
    _tell_tenants_on(
        gpu_ids=[gpu.pk],
        incident=incident,
        subject="A GPU your slice runs on has a fault",
        body=TENANT_ADVICE["hardware_fault"],
    )


def _tell_node_unreachable(incident: Incident | None, node_id: int) -> None:
    ids = list(Gpu.objects.filter(node_id=node_id).values_list("pk", flat=True))
    _tell_tenants_on(
        gpu_ids=ids,
        incident=incident,
        subject="The machine your slice runs on does not answer",
        body=TENANT_ADVICE["node_unreachable"],
    )
    if incident:
        incident_event(incident=incident, kind=E.ACTION, message="Tenants on the node were told.")


def _warn_idle(incident: Incident | None, f: rules.Finding, slice_id: int, now: datetime) -> None:
    """An idle slice's tenant is warned, and its stop scheduled for when it is due."""
    SliceWatch.objects.update_or_create(slice_id=slice_id, defaults={"idle_warned_at": now})
    s = Slice.objects.select_related("tenant").get(pk=slice_id)
    members_notify(tenant=s.tenant, subject=f"Slice {s.pk} is idle", body=f.detail)
    if incident:
        incident_event(
            incident=incident, kind=E.ACTION, message="Tenant warned: idle slices are reclaimed."
        )
    # the stop when it is due (the minute's sweep would come up to a minute late)
    due = Thresholds.current().idle_stop_after_s
    enqueue("incidents.idle_due", slice_id, countdown=due)


def _tell_tenants_on(
    *, gpu_ids: list[int], incident: Incident | None, subject: str, body: str
) -> None:
    """Mail the tenants of the live slices on these GPUs, and record those slices on the
    incident so that their tenants find it on their incident page."""
    touched = list(
        Slice.objects.filter(allocation__gpu_id__in=gpu_ids, state__in=Slice.HOLDS_VRAM_STATES)
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


@transaction.atomic
def incident_confirm_orphan(*, incident: Incident, actor: User) -> Incident:
    """Ops confirm an orphan (a process or container of no slice): it is ended now."""
    require_ops(actor, what="manage incidents")
    incident = incident_lock(incident.pk)
    if incident.rule != "orphan_process" or incident.gpu_id is None:
        raise Conflict("Only an orphan process can be ended from here.", code="not_an_orphan")
    if incident.status == Incident.Status.RESOLVED:
        raise Conflict("This incident is resolved.", code="resolved")
    incident_event(
        incident=incident,
        kind=E.ACTION,
        message="Ops confirmed the orphan: ending it.",
        actor=actor,
    )
    enqueue("incidents.dispose", incident.pk, rules.END_ORPHAN, incident.evidence)
    return incident


# --- ops' actions from an incident: stop its slice, drain its GPU or node ------------------------


@transaction.atomic
def incident_stop_slice(*, incident: Incident, actor: User, reason: str) -> Slice:
    """Ops force-stop the incident's slice (its tenant is told why) and the timeline
    records it; 409 `no_running_slice` when it names none, the slice has ended, or it
    was resumed since the incident last saw it (another run)."""
    require_ops(actor, what="manage incidents")
    s = Slice.objects.filter(pk=incident.slice_id).first() if incident.slice_id else None
    if not can_stop_slice(s):
        raise Conflict(
            "No running slice to stop: it has none, or it has already ended.",
            code="no_running_slice",
        )
    if resumed_since(incident):
        raise Conflict(
            f"Slice {s.pk} was resumed after this incident last saw it: the run it is "
            "about has ended, and the running one is not this incident's to stop.",
            code="no_running_slice",
        )
    s = tenant_services.slice_stop(slice=s, actor=actor, reason=reason, force=True)
    incident_event(
        incident=incident,
        kind=E.ACTION,
        message=f"Slice {s.pk} force-stopped by ops ({s.state}): {reason}",
        actor=actor,
        data={"action": "stop_slice", "slice_id": s.pk, "slice_state": s.state},
    )
    return s


@transaction.atomic
def incident_drain_gpu(*, incident: Incident, actor: User, reason: str) -> Gpu:
    """Ops close the incident's GPU to new placements (running work continues); the
    breaker's own closure may be turned into a drain. 409 `nothing_to_drain` when no GPU
    is named or it already takes no placements for another reason."""
    require_ops(actor, what="manage incidents")
    gpu = (
        Gpu.objects.select_related("node").filter(pk=incident.gpu_id).first()
        if incident.gpu_id is not None
        else None
    )
    if not can_drain_gpu(gpu):
        raise Conflict(
            "No GPU to drain: none is named, or it already takes no placements.",
            code="nothing_to_drain",
        )
    gpu = node_services.gpu_set_accepting(
        gpu=gpu, accepting=False, reason=f"Incident #{incident.pk}: {reason}"
    )
    incident_event(
        incident=incident,
        kind=E.ACTION,
        message=f"Drained {gpu.label}: no new placements, running work continues. {reason}",
        actor=actor,
        data={"action": "drain_gpu", "gpu_id": gpu.pk},
    )
    return gpu


@transaction.atomic
def incident_drain_node(*, incident: Incident, actor: User, reason: str) -> Node:
    """Ops drain the incident's node: none of its GPUs takes new slices, running ones
    continue. 409 `nothing_to_drain` when no node is named or it is draining already."""
    require_ops(actor, what="manage incidents")
    node = incident.affected_node
    node = Node.objects.filter(pk=node.pk).first() if node is not None else None
    if not can_drain_node(node):
        raise Conflict(
            "No node to drain: none is named, or it is already draining.",
            code="nothing_to_drain",
        )
    node = node_services.node_drain(node=node, reason=f"Incident #{incident.pk}: {reason}")
    incident_event(
        incident=incident,
        kind=E.ACTION,
        message=f"Drained node {node.name}: no new placements, running work continues. {reason}",
        actor=actor,
        data={"action": "drain_node", "node_id": node.pk},
    )
    return node


# --- node work, on the incidents queue ---------------------------------------------------------


def incident_dispose(*, incident_id: int, action: str, evidence: dict[str, Any]) -> str:
    """Stop the offending slice's container, end an orphan, or throttle: the offender
    alone. Safe to run twice (a stopped slice is not stopped again)."""
    incident = Incident.objects.select_related("slice", "gpu__node").get(pk=incident_id)
    if action == rules.STOP_SLICE and incident.slice_id:
        return _stop_offender(incident, evidence)
    if action == rules.PREEMPT and incident.slice_id and evidence.get("for_room"):
        return _stop_for_room(incident, evidence)
    if action == rules.PREEMPT and incident.slice_id:
        s = incident.slice
        if s is not None and s.allocation_id and not s.is_final:  # counted per GPU for ops
            node_services.allocation_mark_preempted(allocation_id=s.allocation_id)
        # docker stop with the grace period: the job gets SIGTERM and time to checkpoint
        return _stop_offender(incident, evidence, force=False)
    if action == rules.END_ORPHAN and incident.gpu is not None:
        return _end_orphan(incident, incident.gpu.node, evidence)
    if action == rules.THROTTLE and incident.slice_id:
        return slice_throttle(incident=incident)
    return "nothing to do"


def slice_preemption_notice(*, slice_id: int) -> str:
    """The webhook leg of a preemption notice (tenants.services.slices.preempt): a
    `slice_preempted` incident about the slice, opened now (its tenant's endpoints get
    `incident.opened`), and its disposal queued for the deadline: the stop, if the slice
    has not ended itself by then. Safe to run twice (one open incident per slice)."""
    s = Slice.objects.filter(pk=slice_id).select_related("allocation__gpu").first()
    if s is None or s.preempt_deadline is None or s.is_final:
        return "no notice"
    now = timezone.now()
    left = max(0.0, (s.preempt_deadline - now).total_seconds())
    gpu = s.allocation.gpu if s.allocation is not None else None
    finding = rules.Finding(
        rule="slice_preempted",
        target=f"slice:{s.pk}",
        severity=rules.WARNING,
        root_cause=rules.NO_ISOLATION,
        title=f"Interruptible slice {s.pk} preempted with notice: a full-price launch needs "
        "its room",
        detail=f"Its job was sent SIGTERM; it is stopped in {left:.0f} s at the latest (at "
        f"{s.preempt_deadline.isoformat()}) if it has not ended. Volumes are kept; resume "
        "it when you like.",
        gpu_id=gpu.pk if gpu is not None else None,
        node_id=gpu.node_id if gpu is not None else None,
        slice_id=s.pk,
        tenant_id=s.tenant_id,
        evidence={"for_room": True, "deadline": s.preempt_deadline.isoformat()},
    )
    with transaction.atomic():
        incident, created = incident_record(finding=finding, now=now)
        if not created:
            return "already noticed"
        incident_notify(incident=incident, event="opened")
        enqueue("incidents.dispose", incident.pk, rules.PREEMPT, finding.evidence, countdown=left)
    return "noticed"


def _stop_for_room(incident: Incident, evidence: dict[str, Any]) -> str:
    """At a notice's deadline: stop the slice if it still runs (the notice was its grace),
    or close the incident when it ended within its notice (or was resumed since)."""
    s = incident.slice
    if s is not None and not s.is_final and s.preempt_deadline is not None:
        return _stop_offender(incident, evidence, force=True)
    with transaction.atomic():
        incident = incident_lock(incident.pk)
        if incident.status != Incident.Status.RESOLVED:
            incident_resolve_locked(
                incident=incident,
                actor=None,
                note="The slice ended within its preemption notice.",
                now=timezone.now(),
            )
    return "ended within its notice"


def _stop_offender(
    incident: Incident, evidence: dict[str, Any] | None = None, *, force: bool = True
) -> str:
    s = incident.slice
    if s is None or s.is_final:
        return "already stopped"
    reason = _stop_reason(incident, evidence or {})
    if s.state != Slice.State.STOPPING:
        tenant_services.slice_stop(slice=s, actor=None, reason=reason, force=force)
    # A retry finds it stopping: finish removing the container (raising if the node
    # will not), never release the VRAM while the offender may still hold it.
    state = tenant_services.slice_finish_stop(slice_id=s.pk, force=force)
    with transaction.atomic():
        incident = incident_lock(incident.pk)
        incident_mitigate(
            incident=incident,
            message=f"Stopped slice {s.pk}'s container alone and released its VRAM; "
            "metering stopped.",
            data={"slice_state": state},
            tell=True,
        )
        if state in (Slice.State.STOPPED, Slice.State.COMPLETED, Slice.State.FAILED):
            incident_resolve_locked(
                incident=incident,
                actor=None,
                note="Disposed: the offending slice was stopped.",
                now=timezone.now(),
            )
    members_notify(tenant=s.tenant, subject=f"Slice {s.pk} was stopped", body=reason)
    return state


def _stop_reason(incident: Incident, evidence: dict[str, Any]) -> str:
    """Why the watchdog stopped it, from the finding that stopped it (the incident's own
    evidence is what was seen when it opened)."""
    ev = {**incident.evidence, **evidence}
    if incident.rule == "quota_breach" and ev.get("source") == "node_agent":
        return (
            f"Stopped on its node by the node agent: its processes held {ev.get('used_mb')} "
            f"MiB of a {ev.get('quota_mb')} MiB quota, memory its neighbours on the GPU "
            "were owed. Lower the batch size or context, quantize the model, or buy a "
            "bigger tier."
        )
    if incident.rule == "quota_breach":
        return (
            f"Stopped by the watchdog: its processes used {ev.get('used_mb')} MiB of a "
            f"{ev.get('quota_mb')} MiB quota. Lower the batch size or context, quantize "
            "the model, or buy a bigger tier."
        )
    if incident.rule == "accounting_drift":
        return (
            f"Stopped by the watchdog: the GPU driver saw {ev.get('nvml_mb')} MiB in use by "
            f"its processes but the VRAM quota library counted only {ev.get('library_mb')} "
            "MiB, so memory was taken around the quota (a statically linked program, or "
            "device access that bypasses CUDA). Run jobs linked against the CUDA driver "
            "library."
        )
    if incident.rule == "slice_preempted" and ev.get("for_room"):
        return (
            "Preempted: a full-price launch needed this interruptible slice's room. It had "
            "notice (SIGTERM, a webhook and its timeline) and was stopped when the notice "
            "ended. It is billed to its stop; the minutes it did not use stay on its "
            "purchase: resume it when you like, or buy guaranteed hours for work that must "
            "not stop."
        )
    if incident.rule == "slice_preempted":
        return (
            f"Preempted: this interruptible slice's GPU reached {ev.get('percent')}% of its "
            "memory, so the newest interruptible slices on it were stopped (each with its "
            "grace period to checkpoint). Its volumes are kept: resume it when you like, or "
            "buy guaranteed hours for work that must not stop."
        )
    if incident.rule == "idle_slice":
        return (
            f"Stopped by the watchdog: no compute for {rules.duration(ev.get('idle_s', 0))}, "
            "so its memory was released for others. Launch again when you need it."
        )
    return f"Stopped by the watchdog: {incident.title}."


def _end_orphan(incident: Incident, node: Node, evidence: dict[str, Any]) -> str:
    """End an orphan only if it is the platform's own container with no live slice, as
    the node shows it now; anything else (a bare PID, a container ops run themselves) is
    left for ops with the evidence: a PID may have been reused since the sample."""
    container = evidence.get("container_id") or ""
    pid = evidence.get("pid")
    info = node_services.container_inspect(node=node, container=container) if container else None
    if (
        info is None
        or info.labels.get(runtime.LABEL_MANAGED) != "1"  # not ours
        or owner_is_live(info.owner_key)
    ):
        with transaction.atomic():
            incident_event(
                incident=incident,
                kind=E.NOTE,
                message="Not ended automatically: it is not a platform container without a "
                "live slice (or it is gone). Ops decide from the evidence.",
                data={"pid": pid, "container_id": container},
            )
        return "left for ops"
    node_services.container_remove(node=node, container=info.id, grace_s=0)
    done = f"Removed the platform container {info.id[:12]} holding the memory (no live slice)."
    with transaction.atomic():
        incident = incident_lock(incident.pk)
        incident_mitigate(
            incident=incident,
            message=done,
            data={"pid": pid, "container_id": info.id},
            tell=True,
        )
        incident_resolve_locked(
            incident=incident,
            actor=None,
            note="Disposed: the orphan container was removed.",
            now=timezone.now(),
        )
    return done
