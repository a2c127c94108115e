"""Reads of the incident ledger for pages, API and exports: one query shape each; the
running slices as the watchdog reads them; and what ops may do from an incident."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypedDict, TypeGuard

from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce

from nodes.devices import vram_quota
from nodes.models import Gpu, Node
from tenants.models import Slice, Tenant

from .models import (
    BREAKER_REASON,
    SEVERITY_RANK,
    Incident,
    IncidentEvent,
    NeighbourHarm,
    Thresholds,
)
from .notify import TENANT_TITLES
from .rules import Thresholds as RuleThresholds

SORTS = {
    "last_seen": "-last_seen_at",
    "first_seen": "-first_seen_at",
    "severity": "severity_rank",
    "occurrences": "-occurrences",
}
# What a list shows of an incident (the ledger, its export, the API's lists, a tenant's
# list): everything but the frozen evidence (up to a few KB a row), and of the rows joined
# for a name only that name (a node's row carries its preflight and image lists).
LIST_FIELDS = (
    *(f.name for f in Incident._meta.concrete_fields if f.name != "evidence"),
    "tenant__name",
    "node__name",
    "gpu__index",
    "gpu__uuid",
    "gpu__node__name",
)


class IncidentFilters(TypedDict):
    """The ledger's filters as a page's form reads them, for `incident_list`."""

    status: str
    severity: str
    root_cause: str
    rule: str
    node: str
    gpu: str
    tenant_id: int | None
    since: datetime | None
    until: datetime | None
    search: str
    sort: str


def incident_list(
    *,
    tenant: Tenant | None = None,
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
    evidence: bool = False,
) -> QuerySet[Incident]:
    """Ops see every incident (tenant=None); a tenant those about its slices and those
    that touched them. Rows as a list shows them (LIST_FIELDS); `evidence`: whole rows,
    for one incident's page."""
    if evidence:
        qs = Incident.objects.select_related("tenant", "node", "gpu__node", "slice")
    else:
        qs = Incident.objects.select_related("tenant", "node", "gpu__node").only(*LIST_FIELDS)
    if tenant is not None:
        # its own only where they are about a slice (a slice gone, the incident stays ops')
        qs = (
            qs.for_tenant(tenant)
            .exclude(tenant=tenant, slice__isnull=True)
            .prefetch_related("touched")
        )
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
    if tenant_id is not None:
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
    qs = qs.annotate(severity_rank=SEVERITY_RANK)
    return qs.order_by(*sort_keys(sort))


def sort_keys(sort: str) -> tuple[str, str]:
    """The list's order: the sort's field, then the newest id first (which makes the
    order total, so a page can begin exactly where the one before ended)."""
    return SORTS.get(sort, SORTS["last_seen"]), "-id"


def incident_timeline(*, incident: Incident) -> QuerySet[IncidentEvent]:
    return incident.events.select_related("actor").order_by("at", "id")


def thresholds() -> Thresholds:
    return Thresholds.current()


def vram_warning_pct() -> float:
    """The watchdog's VRAM warning line as ops set it (the default before they did): one
    narrow read, and no row made by reading it."""
    line = Thresholds.objects.order_by("pk").values_list("vram_warning_pct", flat=True).first()
    return RuleThresholds().vram_warning_pct if line is None else line


def incident_search_for_tenant(queryset: QuerySet[Incident], text: str) -> QuerySet[Incident]:
    """A tenant's search of its incidents, over the titles it is shown: an incident's own
    for its slices, the plain one for an outage that touched them (whose own title names
    the node)."""
    shown = [rule for rule, title in TENANT_TITLES.items() if text.lower() in title.lower()]
    return queryset.filter(
        Q(slice__isnull=False, title__icontains=text) & ~Q(rule__in=TENANT_TITLES)
        | Q(rule__in=shown)
    )


class LiveSlice(TypedDict):
    """A running slice as the rules read it (a plain row)."""

    pk: int
    tenant_id: int
    quota: int  # the VRAM it is held to, MiB: its tier's, or its MIG instance's (vram_quota)
    cid: str  # its container
    gpu_id: int
    node_id: int
    mig: bool
    interruptible: bool
    started: float  # a timestamp; 0.0 if it never started


def live_slices(*, node_ids: list[int] | None = None) -> tuple[list[LiveSlice], set[str]]:
    """Running slices on these nodes (all, for None), and every container a live slice
    owns there (processes in them are nobody's orphans)."""
    live = Slice.objects.filter(state__in=Slice.HOLDS_VRAM_STATES)
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
            # a few entries where the card is MIG-partitioned, [] elsewhere: no extra query
            "allocation__gpu__mig_devices",
            "purchase__interruptible",
            "started_at",
        )
    )
    known = {r["container_id"] for r in rows if r["container_id"]}
    running: list[LiveSlice] = [
        {
            "pk": r["pk"],
            "tenant_id": r["tenant_id"],
            "quota": vram_quota(
                tier_mb=r["vram_mb"],
                mig_device_uuid=r["allocation__mig_device_uuid"] or "",
                mig_devices=r["allocation__gpu__mig_devices"],
            ).mb,
            "cid": r["container_id"],
            "gpu_id": r["allocation__gpu_id"],
            "node_id": r["allocation__gpu__node_id"],
            "mig": bool(r["allocation__mig_device_uuid"]),
            "interruptible": bool(r["purchase__interruptible"]),
            "started": r["started_at"].timestamp() if r["started_at"] else 0.0,
        }
        for r in rows
        if r["state"] == Slice.State.RUNNING and r["container_id"]
    ]
    return running, known


# What the incident page offers and what the services accept: one rule each, judged on
# the slice, GPU or node as the caller read it.


def can_stop_slice(slice: Slice | None) -> TypeGuard[Slice]:
    return slice is not None and not slice.is_final


def resumed_since(incident: Incident) -> bool:
    """The incident's slice was started again after the incident last saw it: its live
    run is another one than the incident is about."""
    slice = incident.slice
    if slice is None or slice.runs <= 1:
        return False
    return slice.transitions.filter(
        from_state__in=Slice.FINAL_STATES,
        to_state=Slice.State.REQUESTED,
        at__gt=incident.last_seen_at,
    ).exists()


def can_stop_incident_slice(incident: Incident) -> bool:
    """The incident's slice may be force-stopped: it runs, and it is the run the incident
    is about (a slice resumed since runs a fresh start, not the one that offended)."""
    return can_stop_slice(incident.slice) and not resumed_since(incident)


def can_drain_gpu(gpu: Gpu | None) -> TypeGuard[Gpu]:
    """Open to placements, or closed only by the breaker (which lifts by itself: ops may
    turn it into a drain)."""
    return gpu is not None and (
        gpu.accepting_placements or gpu.not_accepting_reason.startswith(BREAKER_REASON)
    )


def can_drain_node(node: Node | None) -> TypeGuard[Node]:
    return node is not None and node.drained_at is None


def incident_harms(*, incident: Incident) -> list[NeighbourHarm]:
    """For ops: the neighbour harms an incident is about. The harmed slice's incident lists
    its harm (with the offenders' incidents to open); an offender's stop lists the harms
    its memory caused."""
    if incident.rule == "neighbour_harm":
        _, node_id, harm_id = (incident.target_key.split(":") + ["", ""])[:3]
        if not node_id.isdigit():
            return []
        return list(NeighbourHarm.objects.filter(node_id=int(node_id), harm_id=harm_id))
    if incident.rule in ("quota_breach", "accounting_drift") and incident.node_id:
        # by the harms on its node around it (JSON containment is not SQLite's), then the
        # link each harm keeps
        around = NeighbourHarm.objects.filter(
            node_id=incident.node_id,
            started_at__gte=incident.first_seen_at - timedelta(hours=1),
            started_at__lte=incident.last_seen_at + timedelta(hours=1),
        ).order_by("-started_at")[:200]
        return [h for h in around if incident.pk in h.offender_incidents][:20]
    return []


def neighbour_harm_kpis(*, since: datetime, until: datetime) -> dict[str, Any]:
    """Neighbours hurt in a period, by the node agent's rule (NeighbourHarm rows that began
    in it): how many harms, how many slices, and for how long (longest and in all; a harm
    still going on counts up to `until`). One aggregate query."""
    lasted = ExpressionWrapper(
        Coalesce("ended_at", Value(until)) - F("started_at"), output_field=DurationField()
    )
    sums = NeighbourHarm.objects.filter(started_at__gte=since, started_at__lt=until).aggregate(
        harms=Count("pk"),
        slices=Count("slice", distinct=True),
        longest=Max(lasted),
        total=Sum(lasted),
        going_on=Count("pk", filter=Q(ended_at__isnull=True)),
    )
    return {
        "harms": sums["harms"],
        "slices": sums["slices"],
        "longest_s": sums["longest"].total_seconds() if sums["longest"] else 0.0,
        "total_s": sums["total"].total_seconds() if sums["total"] else 0.0,
        "going_on": sums["going_on"],
    }
