"""The incident ledger: one open incident per rule and target, counted, escalated,
acknowledged, resolved, reopened and archived, each step an event on its timeline.

The runbook's five steps are the timeline: detected, located and classified as an
incident opens (`incident_record`), disposed (`incident_mitigate`), archived as it is
resolved (`incident_resolve_locked`). Who was told an incident started is told it ended.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypedDict

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.errors import Conflict, ServiceError
from gpuplatform.ops import require_ops

from .. import rules
from ..evidence import condition_since_of
from ..locks import incident_lock, incident_open_lock
from ..models import Incident, IncidentEvent
from ..notify import incident_notify

E = IncidentEvent.Kind
SEVERITY_RANK = {rules.INFO: 0, rules.WARNING: 1, rules.CRITICAL: 2}


class IncidentContext(TypedDict, total=False):
    """What a new incident is told about where it happened (gathered only when one opens):
    the names its located step gives, and evidence frozen beside the finding's."""

    gpu_name: str
    node_name: str
    tenant_name: str
    evidence: dict[str, Any]


def incident_event(
    *,
    incident: Incident,
    kind: str,
    message: str,
    actor: User | None = None,
    data: dict[str, Any] | None = None,
) -> IncidentEvent:
    return IncidentEvent.objects.create(
        incident=incident,
        kind=kind,
        message=message[:500],
        actor=actor if actor is not None and actor.is_authenticated else None,
        data=data or {},
    )


def _located(f: rules.Finding, context: IncidentContext) -> str:
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
    *,
    finding: rules.Finding,
    now: datetime,
    context: IncidentContext | Callable[[], IncidentContext] | None = None,
) -> tuple[Incident, bool]:
    """Open an incident for the finding, or count another occurrence of the open one
    (one per rule and target). A new one gets the runbook's first three steps; its
    context (names, frozen evidence) is only gathered then: `context` may be a callable."""
    open_one = incident_open_lock(rule=finding.rule, target=finding.target)
    if open_one is not None:
        _count_again(open_one, finding, now)
        return open_one, False
    context = (context() if callable(context) else context) or {}
    evidence = _frozen_evidence(finding, now, context)
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
                condition_since=condition_since_of(evidence),
                first_seen_at=now,
                last_seen_at=now,
            )
    except IntegrityError:  # another worker opened it a moment ago: count this one
        return incident_record(finding=finding, now=now, context=context)
    _first_steps(incident, finding, context)
    return incident, True


def _count_again(open_one: Incident, finding: rules.Finding, now: datetime) -> None:
    """Another occurrence of the open incident; a more severe one escalates it."""
    open_one.occurrences += 1
    open_one.last_seen_at = max(open_one.last_seen_at, now)  # sweeps may overlap
    fields = ["occurrences", "last_seen_at"]
    if SEVERITY_RANK[finding.severity] > SEVERITY_RANK.get(open_one.severity, 0):
        open_one.severity = finding.severity
        open_one.title = finding.title[:200]
        fields += ["severity", "title"]
        incident_event(
            incident=open_one,
            kind=E.NOTE,
            message=f"Escalated to {finding.severity}: {finding.title}",
        )
        open_one.save(update_fields=fields)
        incident_notify(incident=open_one, event="escalated")
        return
    open_one.save(update_fields=fields)


def _frozen_evidence(
    finding: rules.Finding, now: datetime, context: IncidentContext
) -> dict[str, Any]:
    """The finding's evidence as the incident keeps it, with when it was detected, when
    the condition began as far as the samples show (time to detect), and the context's."""
    since = finding.evidence.get("since_epoch")
    return {
        **finding.evidence,
        "detail": finding.detail,
        "detected_at": now.isoformat(),
        "condition_since": (
            datetime.fromtimestamp(since, tz=UTC).isoformat() if since else now.isoformat()
        ),
        **context.get("evidence", {}),
    }


def _first_steps(incident: Incident, finding: rules.Finding, context: IncidentContext) -> None:
    """The runbook's first three steps on a new incident's timeline."""
    incident_event(
        incident=incident, kind=E.DETECTED, message=finding.title, data={"rule": finding.rule}
    )
    incident_event(
        incident=incident, kind=E.LOCATED, message=f"Located: {_located(finding, context)}."
    )
    incident_event(
        incident=incident,
        kind=E.CLASSIFIED,
        message=f"Classified: {Incident.RootCause(finding.root_cause).label}.",
        data={"root_cause": finding.root_cause},
    )


def incident_clear(*, finding: rules.Finding, now: datetime, note: str = "") -> Incident | None:
    """The condition is gone: the system resolves the open incident and archives it."""
    incident = incident_open_lock(rule=finding.rule, target=finding.target)
    if incident is None:
        return None
    incident_resolve_locked(
        incident=incident,
        actor=None,
        note=note or f"Condition cleared: {finding.title}.",
        now=now,
    )
    return incident


def incident_resolve_locked(
    *, incident: Incident, actor: User | None, note: str, now: datetime
) -> None:
    """Resolve and archive an incident whose row the caller holds (locked or just made)."""
    incident.status = Incident.Status.RESOLVED
    incident.resolved_at = now
    incident.resolved_by = actor if actor is not None and actor.is_authenticated else None
    incident.resolution_note = note[:2000]
    incident.save(update_fields=["status", "resolved_at", "resolved_by", "resolution_note"])
    incident_event(incident=incident, kind=E.STATUS, message=f"Resolved: {note}"[:500], actor=actor)
    incident_event(incident=incident, kind=E.ARCHIVED, message=_archive_line(incident), actor=actor)
    if actor is not None or incident.severity == Incident.Severity.CRITICAL or incident.slice_id:
        # Who was told it started is told it ended (a warning that clears itself is not).
        incident_notify(incident=incident, event="resolved")


def _archive_line(incident: Incident) -> str:
    """Step five: tenant account, task, time, symptom and disposition, in one line."""
    disposed = (
        incident.events.filter(kind=E.DISPOSED).order_by("-at").values_list("message", flat=True)
    ).first()
    who = incident.tenant.name if incident.tenant is not None else "no tenant"
    task = f"slice {incident.slice_id}" if incident.slice_id else incident.target_key
    return (
        f"Archived: {who}; {task}; {incident.first_seen_at:%Y-%m-%d %H:%M:%S} UTC; "
        f"{incident.title}; {disposed or 'no action needed'}."
    )[:500]


@transaction.atomic
def incident_acknowledge(*, incident: Incident, actor: User) -> Incident:
    require_ops(actor, what="manage incidents")
    incident = incident_lock(incident.pk)
    if incident.status == Incident.Status.RESOLVED:
        raise Conflict("This incident is resolved; reopen it first.", code="resolved")
    if incident.status == Incident.Status.OPEN:
        incident.status = Incident.Status.ACKNOWLEDGED
        incident.acknowledged_by = actor
        incident.acknowledged_at = timezone.now()
        incident.save(update_fields=["status", "acknowledged_by", "acknowledged_at"])
        incident_event(incident=incident, kind=E.STATUS, message="Acknowledged.", actor=actor)
    return incident


def incidents_acknowledge(*, ids: list[int], actor: User) -> int:
    """Bulk acknowledge; resolved ones and ids that do not exist are skipped."""
    require_ops(actor, what="manage incidents")
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
def incident_resolve(*, incident: Incident, actor: User, note: str) -> Incident:
    require_ops(actor, what="manage incidents")
    note = (note or "").strip()
    if not note:
        raise ServiceError("Say how it was resolved.", field="note")
    incident = incident_lock(incident.pk)
    if incident.status == Incident.Status.RESOLVED:
        return incident
    incident_resolve_locked(incident=incident, actor=actor, note=note, now=timezone.now())
    return incident


@transaction.atomic
def incident_reopen(*, incident: Incident, actor: User, note: str = "") -> Incident:
    require_ops(actor, what="manage incidents")
    incident = incident_lock(incident.pk)
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
    incident_event(
        incident=incident, kind=E.STATUS, message=f"Reopened. {note}".strip(), actor=actor
    )
    incident_notify(incident=incident, event="reopened")
    return incident


def incident_mitigate(
    *,
    incident: Incident,
    message: str,
    actor: User | None = None,
    data: dict[str, Any] | None = None,
    tell: bool = False,
) -> None:
    """Record a disposal; `tell`: one done later than the alarm (a stop by the worker),
    which ops are told of as its own event (an action taken as the incident opens is
    in the alarm's mail already)."""
    if incident.status in (Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED):
        incident.status = Incident.Status.MITIGATED
        incident.save(update_fields=["status"])
    incident_event(incident=incident, kind=E.DISPOSED, message=message, actor=actor, data=data)
    if tell:
        incident_notify(incident=incident, event="action")
