"""The incident KPIs on the ops KPI page: a handful of aggregate queries per period.

Definitions (the page states them too):
- GPU-hours: for each GPU present now, the hours of the period since it was discovered
  (a GPU registered mid-period counts from then on).
- Incidents per 1,000 GPU-hours: incidents first seen in the period x 1000 / GPU-hours
  (none below one GPU-hour).
- Memory-preemption failure rate: of the slices that ran in the period (started before
  its end, not stopped before its start, placed on a GPU), the share hurt by a
  neighbour: the slice failed, not by its own job's doing, while a critical memory
  incident (no isolation, or a reclaim failure) about another slice or the whole card
  was open on its GPU, or within 5 minutes after. A completed run (exit 0), the job's
  own error exit and its running out of memory inside its own quota (`Slice.ended_by`
  = job) never count. An incident the isolation contained hurts nobody.
- Mean time to detect: first seen minus when the condition began as far as the samples
  show (evidence "condition_since", kept in its own column `condition_since`: the
  breaching sample, the start of a leak's steady growth, the last compute of an idle
  slice, the low point of a rise); 0 without it.
- Mean time to resolve: resolved minus first seen, over those incidents that are resolved.
Everything is over incidents first seen in the period.

The incidents of a period are read once, from the first-seen index alone (it carries
every column read here), grouped by class, node (or GPU) and day; the totals, the
classes, the nodes and the days are summed from those groups. A million incidents are
one index scan, never a row of evidence.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, TypedDict, cast

from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    Case,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, Least, TruncDate
from django.utils import timezone

from nodes.models import Gpu, Node
from tenants.models import Slice

from .models import Incident

PERIODS = (7, 30, 90)
ZERO = timedelta(0)
NO_NODE = "(no node)"
MEMORY_CLASSES = ("no_isolation", "reclaim_failure")
HURT_SLACK = timedelta(minutes=5)
# Below one GPU-hour a rate per 1,000 GPU-hours says nothing (a GPU found a minute ago
# would turn one incident into millions): no rate is given.
MIN_GPU_HOURS = 1.0


def _hours(value: timedelta | None) -> float:
    return (value or ZERO).total_seconds() / 3600


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _per_1000(incidents: int, gpu_hours: float) -> float | None:
    return round(incidents * 1000 / gpu_hours, 2) if gpu_hours >= MIN_GPU_HOURS else None


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 2) if whole else None


def incidents_in(*, since: datetime, until: datetime) -> QuerySet[Incident]:
    """Incidents first seen in [since, until), with their detect and resolve durations."""
    detect = Case(
        When(
            condition_since__isnull=False,
            then=Greatest(
                ExpressionWrapper(
                    F("first_seen_at") - F("condition_since"), output_field=DurationField()
                ),
                Value(ZERO),
            ),
        ),
        default=Value(ZERO),
        output_field=DurationField(),
    )
    return Incident.objects.filter(first_seen_at__gte=since, first_seen_at__lt=until).annotate(
        detect=detect,
        resolve=ExpressionWrapper(
            F("resolved_at") - F("first_seen_at"), output_field=DurationField()
        ),
    )


class Group(TypedDict):
    """A group of the period's incidents, as the grouped passes read it."""

    incidents: int
    resolved: int
    detect_sum: timedelta | None
    resolve_sum: timedelta | None


class ClassDayGroup(Group):
    root_cause: str
    day: date


class PlaceGroup(Group):
    node_id: int | None
    gpu_key: int | None  # the incident's GPU where it names no node


@dataclass
class _Sums:
    """What the means are made of: summed over groups, divided once at the end."""

    incidents: int = 0
    resolved: int = 0
    detect: timedelta = ZERO
    resolve: timedelta = ZERO

    def add(self, group: Group) -> None:
        self.incidents += group["incidents"]
        self.resolved += group["resolved"]
        self.detect += group["detect_sum"] or ZERO
        self.resolve += group["resolve_sum"] or ZERO

    def row(self) -> dict[str, Any]:
        # a mean over the incidents (detect is 0 without a start), over the resolved ones
        return {
            "incidents": self.incidents,
            "resolved": self.resolved,
            "mttd_s": _seconds(self.detect / self.incidents) if self.incidents else None,
            "mttr_s": _seconds(self.resolve / self.resolved) if self.resolved else None,
        }


_SUMS: dict[str, Any] = {
    "incidents": Count("id"),
    "resolved": Count("id", filter=Q(resolved_at__isnull=False)),
    "detect_sum": Sum("detect"),
    "resolve_sum": Sum("resolve"),
}


def incident_groups(*, since: datetime, until: datetime) -> list[ClassDayGroup]:
    """The period's incidents by class and day: counts and summed durations, one pass over
    the first-seen index (a few hundred groups: the totals, the classes and the series
    per day are sums of them)."""
    groups = (
        incidents_in(since=since, until=until)
        .annotate(day=TruncDate("first_seen_at"))
        .values("root_cause", "day")
        .annotate(**_SUMS)
        .order_by()
    )
    # PostgreSQL takes a day of first_seen_at to have as many values as first_seen_at
    # itself, so it expects a group per row and sorts them all (on disk past a few days);
    # there are a few hundred groups, which it hashes in memory once told not to sort.
    if connection.vendor != "postgresql":  # SQLite plans no sort to switch off
        return cast("list[ClassDayGroup]", list(groups))
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off")
        rows = list(groups)
        cursor.execute("RESET enable_sort")
    # the stubs type values() rows by the fields named, not the **_SUMS annotated on them
    return cast("list[ClassDayGroup]", rows)


def incident_places(*, since: datetime, until: datetime) -> list[PlaceGroup]:
    """The period's incidents by the node they name, or by their GPU where they name no
    node (its node is looked up after, for the few groups): counts and summed durations,
    a second pass over the same index. Nothing is joined here (a join per row costs as
    much as the scan)."""
    rows = list(
        incidents_in(since=since, until=until)
        .annotate(gpu_key=Case(When(node_id__isnull=True, then=F("gpu_id")), default=None))
        .values("node_id", "gpu_key")
        .annotate(**_SUMS)
        .order_by()
    )
    # the stubs type values() rows by the fields named, not the **_SUMS annotated on them
    return cast("list[PlaceGroup]", rows)


def node_names(*, node_ids: set[int], gpu_ids: set[int]) -> tuple[dict[int, str], dict[int, str]]:
    """The names of these nodes, and of these GPUs' nodes (one query)."""
    nodes = (
        Node.objects.filter(pk__in=node_ids)
        .annotate(kind=Value(0, output_field=IntegerField()))
        .values_list("kind", "pk", "name")
        .order_by()  # no ORDER BY inside a UNION's parts (SQLite refuses one)
    )
    gpus = (
        Gpu.objects.filter(pk__in=gpu_ids)
        .annotate(kind=Value(1, output_field=IntegerField()))
        .values_list("kind", "pk", "node__name")
        .order_by()
    )
    by_node: dict[int, str] = {}
    by_gpu: dict[int, str] = {}
    for kind, pk, name in nodes.union(gpus, all=True):
        (by_gpu if kind else by_node)[pk] = name
    return by_node, by_gpu


def gpu_hours_by_node(*, since: datetime, until: datetime) -> dict[str, float]:
    """Hours of the period each present GPU existed, summed per node (one query)."""
    existed = ExpressionWrapper(
        Value(until) - Greatest(F("discovered_at"), Value(since)), output_field=DurationField()
    )
    rows = (
        Gpu.objects.filter(present=True, discovered_at__lt=until)
        .values("node__name")
        .annotate(span=Sum(existed))
        .order_by()
    )
    return {row["node__name"]: _hours(row["span"]) for row in rows}


def slices_hurt_by_node(*, since: datetime, until: datetime) -> dict[str, tuple[int, int]]:
    """Per node: (slices that ran in the period, of which hurt by a neighbour's incident)."""
    # Hurt = the slice failed, its job not the cause, while a neighbour's critical memory
    # incident was open on its GPU (or within HURT_SLACK after): an incident the isolation
    # contained (the neighbour stopped alone, the others ran on) hurts nobody.
    neighbour = (
        Incident.objects.filter(
            gpu_id=OuterRef("allocation__gpu_id"),
            severity=Incident.Severity.CRITICAL,
            root_cause__in=MEMORY_CLASSES,
        )
        .filter(Q(slice__isnull=True) | ~Q(slice_id=OuterRef("pk")))
        .annotate(ended=Coalesce("resolved_at", Value(until)) + Value(HURT_SLACK))
        .filter(first_seen_at__lte=OuterRef("stopped_at"), ended__gte=OuterRef("stopped_at"))
    )
    rows = (
        Slice.objects.filter(
            started_at__isnull=False, started_at__lt=until, allocation__isnull=False
        )
        .filter(Q(stopped_at__isnull=True) | Q(stopped_at__gt=since))
        .annotate(
            run_start=Greatest("started_at", Value(since)),
            run_end=Least(Coalesce("stopped_at", Value(until)), Value(until)),
        )
        # only a failed slice its own job did not end is asked about its neighbours (most
        # ran to their end; a completed run, the job's own error exit or its running out
        # of memory inside its own quota is nobody else's doing)
        .annotate(
            hurt=Case(
                When(
                    Q(state=Slice.State.FAILED) & ~Q(ended_by=Slice.EndedBy.JOB),
                    then=Exists(neighbour),
                ),
                default=Value(False),
                output_field=BooleanField(),
            )
        )
        .values("allocation__gpu__node__name")
        .annotate(ran=Count("id"), hurt_n=Count("id", filter=Q(hurt=True)))
        .order_by()
    )
    return {
        row["allocation__gpu__node__name"] or NO_NODE: (row["ran"], row["hurt_n"]) for row in rows
    }


def _days(since: datetime, until: datetime) -> list[date]:
    # Days in the current time zone, as TruncDate groups them.
    first = timezone.localtime(since).date()
    last = timezone.localtime(until - timedelta(microseconds=1)).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def compute(*, since: datetime, until: datetime) -> dict[str, Any]:
    """Every number and series of the KPI page for [since, until)."""
    total, classes_sums, per_day = _sums_by_class(since=since, until=until)
    nodes_sums = _sums_by_node(since=since, until=until)
    totals = total.row()
    classes = dict(Incident.RootCause.choices)
    hours = gpu_hours_by_node(since=since, until=until)
    slices = slices_hurt_by_node(since=since, until=until)
    gpu_hours = sum(hours.values())
    ran = sum(r for r, _ in slices.values())
    hurt = sum(h for _, h in slices.values())
    return {
        "since": since,
        "until": until,
        "period_hours": round((until - since).total_seconds() / 3600, 2),
        "gpu_hours": round(gpu_hours, 2),
        "per_1000_gpu_hours": _per_1000(totals["incidents"], gpu_hours),
        "slices_ran": ran,
        "slices_hurt": hurt,
        "preemption_rate_pct": _pct(hurt, ran),
        **totals,
        "by_class": _class_rows(classes_sums, classes),
        "by_node": _node_rows(nodes_sums, hours, slices),
        "per_day": _per_day_series(per_day, _days(since, until), classes),
    }


def _sums_by_class(
    *, since: datetime, until: datetime
) -> tuple[_Sums, dict[str, _Sums], dict[str, dict[date, int]]]:
    """The period's sums in all, per class, and its incidents per class and day."""
    total = _Sums()
    classes_sums: dict[str, _Sums] = defaultdict(_Sums)
    per_day: dict[str, dict[date, int]] = defaultdict(lambda: defaultdict(int))
    for g in incident_groups(since=since, until=until):
        total.add(g)
        classes_sums[g["root_cause"]].add(g)
        per_day[g["root_cause"]][g["day"]] += g["incidents"]
    return total, classes_sums, per_day


def _sums_by_node(*, since: datetime, until: datetime) -> dict[str, _Sums]:
    """The period's sums per node name: the incident's node, else its GPU's node, else
    none (as the ledger says where)."""
    nodes_sums: dict[str, _Sums] = defaultdict(_Sums)
    places = incident_places(since=since, until=until)
    node_named, gpu_node_named = node_names(
        node_ids={g["node_id"] for g in places if g["node_id"] is not None},
        gpu_ids={g["gpu_key"] for g in places if g["gpu_key"] is not None},
    )
    for g in places:
        if g["node_id"] is not None:
            name = node_named.get(g["node_id"], NO_NODE)
        elif g["gpu_key"] is not None:
            name = gpu_node_named.get(g["gpu_key"], NO_NODE)
        else:
            name = NO_NODE
        nodes_sums[name].add(g)
    return nodes_sums


def _class_rows(classes_sums: dict[str, _Sums], classes: dict[str, str]) -> list[dict[str, Any]]:
    """One row per class, the most incidents first."""
    return sorted(
        (
            {"root_cause": cause, "label": classes.get(cause, cause)} | sums.row()
            for cause, sums in classes_sums.items()
        ),
        key=lambda r: (-r["incidents"], r["root_cause"]),
    )


def _node_rows(
    nodes_sums: dict[str, _Sums], hours: dict[str, float], slices: dict[str, tuple[int, int]]
) -> list[dict[str, Any]]:
    """One row per node that had incidents, GPU-hours or slices, by name."""
    by_node_incidents = {name: sums.row() for name, sums in nodes_sums.items()}
    empty = {"incidents": 0, "resolved": 0, "mttd_s": None, "mttr_s": None}
    by_node = []
    for name in sorted(set(by_node_incidents) | set(hours) | set(slices)):
        row = {"node": name} | by_node_incidents.get(name, empty)
        ran, hurt = slices.get(name, (0, 0))
        row |= {
            "gpu_hours": round(hours.get(name, 0.0), 2),
            "per_1000_gpu_hours": _per_1000(row["incidents"], hours.get(name, 0.0)),
            "slices_ran": ran,
            "slices_hurt": hurt,
            "preemption_rate_pct": _pct(hurt, ran),
        }
        by_node.append(row)
    return by_node


def _per_day_series(
    per_day: dict[str, dict[date, int]], days: list[date], classes: dict[str, str]
) -> dict[str, Any]:
    """The incidents per day, one series per class: the chart's labels and data."""
    return {
        "labels": [d.isoformat() for d in days],
        "series": [
            {
                "root_cause": cause,
                "label": classes.get(cause, cause),
                "counts": [per_day[cause].get(d, 0) for d in days],
            }
            for cause in sorted(per_day)
        ],
    }
