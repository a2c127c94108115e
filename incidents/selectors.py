"""Reads of the incident ledger for pages, API and exports: one query shape each."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from .models import Incident, IncidentEvent, Thresholds

SORTS = {
    "last_seen": "-last_seen_at",
    "first_seen": "-first_seen_at",
    "severity": "severity_rank",
    "occurrences": "-occurrences",
}


def incident_list(
    *,
    tenant=None,  # type: ignore[no-untyped-def]
    status: str = "",
    severity: str = "",
    root_cause: str = "",
    rule: str = "",
    node: str = "",
    gpu: str = "",
    tenant_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    search: str = "",
    sort: str = "last_seen",
) -> QuerySet[Incident]:
    """Ops see every incident (tenant=None); a tenant those about its slices and those
    that touched them."""
    from django.db.models import Case, IntegerField, Value, When

    qs = Incident.objects.select_related("tenant", "node", "gpu__node", "slice")
    if tenant is not None:
        from .models import IncidentSlice
        from .notify import OPS_ONLY

        touched = IncidentSlice.objects.filter(tenant=tenant).values("incident_id")
        qs = qs.filter(Q(tenant=tenant, slice__isnull=False) | Q(pk__in=touched)).exclude(
            rule__in=OPS_ONLY
        )
        qs = qs.prefetch_related("touched")
    if status == "unresolved":
        qs = qs.open()
    elif status:
        qs = qs.filter(status=status)
    if severity:
        qs = qs.filter(severity=severity)
    if root_cause:
        qs = qs.filter(root_cause=root_cause)
    if rule:
        qs = qs.filter(rule=rule)
    if node:
        qs = qs.filter(Q(node__name=node) | Q(gpu__node__name=node))
    if gpu:
        qs = qs.filter(gpu__uuid=gpu)
    if tenant_id:
        qs = qs.filter(tenant_id=tenant_id)
    if since:
        qs = qs.filter(last_seen_at__gte=since)
    if until:
        qs = qs.filter(first_seen_at__lte=until)
    if search:
        qs = qs.filter(
            Q(title__icontains=search)
            | Q(target_key__icontains=search)
            | Q(tenant__name__icontains=search)
            | Q(resolution_note__icontains=search)
        )
    qs = qs.annotate(
        severity_rank=Case(
            When(severity="critical", then=Value(0)),
            When(severity="warning", then=Value(1)),
            default=Value(2),
            output_field=IntegerField(),
        )
    )
    return qs.order_by(SORTS.get(sort, SORTS["last_seen"]), "-id")


def incident_timeline(*, incident: Incident) -> QuerySet[IncidentEvent]:
    return incident.events.select_related("actor").order_by("at", "id")


def thresholds() -> Thresholds:
    return Thresholds.current()
