"""The incident KPIs on the ops KPI page: a handful of aggregate queries per period.

Definitions (the page states them too):
- GPU-hours: for each GPU present now, the hours of the period since it was discovered
  (a GPU registered mid-period counts from then on).
- Incidents per 1,000 GPU-hours: incidents first seen in the period x 1000 / GPU-hours
  (none below one GPU-hour).
- Memory-preemption failure rate: of the slices that ran in the period (started before
  its end, not stopped before its start, placed on a GPU), the share hurt by a
  neighbour: the slice failed while a critical memory incident (no isolation, or a
  reclaim failure) about another slice or the whole card was open on its GPU, or
  within 5 minutes after. An incident the isolation contained hurts nobody.
- Mean time to detect: first seen minus when the condition began as far as the samples
  show (evidence "condition_since": the breaching sample, the start of a leak's steady
  growth, the last compute of an idle slice, the low point of a rise); 0 without it.
- Mean time to resolve: resolved minus first seen, over those incidents that are resolved.
Everything is over incidents first seen in the period.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, timedelta
from typing import Any

from django.db.models import (
    Avg,
    Case,
    Count,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Greatest, Least, TruncDate
from django.utils import timezone

from nodes.models import Gpu
from tenants.models import Slice

from .models import Incident

PERIODS = (7, 30, 90)
ZERO = timedelta(0)
# When the condition began: an ISO time, as services.incident_record writes it.
ISO_TIME = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}"
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
            window_start__regex=ISO_TIME,
            then=Greatest(
                ExpressionWrapper(
                    F("first_seen_at") - Cast("window_start", DateTimeField()),
                    output_field=DurationField(),
                ),
                Value(ZERO),
            ),
        ),
        default=Value(ZERO),
        output_field=DurationField(),
    )
    return (
        Incident.objects.filter(first_seen_at__gte=since, first_seen_at__lt=until)
        .annotate(
            window_start=KT("evidence__condition_since"),
            node_name=Coalesce("node__name", "gpu__node__name", Value(NO_NODE)),
        )
        .annotate(
            detect=detect,
            resolve=ExpressionWrapper(
                F("resolved_at") - F("first_seen_at"), output_field=DurationField()
            ),
        )
    )


def _incident_stats() -> dict[str, Any]:
    return {
        "incidents": Count("id"),
        "resolved": Count("id", filter=Q(resolved_at__isnull=False)),
        "mttd": Avg("detect"),
        "mttr": Avg("resolve"),
    }


def _row(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "incidents": values["incidents"],
        "resolved": values["resolved"],
        "mttd_s": _seconds(values["mttd"]) if values["incidents"] else None,
        "mttr_s": _seconds(values["mttr"]),
    }


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
    # Hurt = the slice itself failed while a neighbour's critical memory incident was
    # open on its GPU (or within HURT_SLACK after): an incident the isolation contained
    # (the neighbour stopped alone, the others ran on) hurts nobody.
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
        .annotate(hurt=Exists(neighbour) & Q(state=Slice.State.FAILED))
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
    incidents = incidents_in(since=since, until=until)
    totals = _row(incidents.aggregate(**_incident_stats()))
    classes = dict(Incident.RootCause.choices)
    by_class = [
        {"root_cause": r["root_cause"], "label": classes.get(r["root_cause"], r["root_cause"])}
        | _row(r)
        for r in incidents.values("root_cause").annotate(**_incident_stats()).order_by("-incidents")
    ]
    by_node_incidents = {
        r["node_name"]: _row(r)
        for r in incidents.values("node_name").annotate(**_incident_stats()).order_by()
    }
    hours = gpu_hours_by_node(since=since, until=until)
    slices = slices_hurt_by_node(since=since, until=until)
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
    per_day: dict[str, dict[date, int]] = defaultdict(dict)
    for r in (
        incidents.annotate(day=TruncDate("first_seen_at"))
        .values("day", "root_cause")
        .annotate(n=Count("id"))
        .order_by()
    ):
        per_day[r["root_cause"]][r["day"]] = r["n"]
    days = _days(since, until)
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
        "by_class": by_class,
        "by_node": by_node,
        "per_day": {
            "labels": [d.isoformat() for d in days],
            "series": [
                {
                    "root_cause": cause,
                    "label": classes.get(cause, cause),
                    "counts": [per_day[cause].get(d, 0) for d in days],
                }
                for cause in sorted(per_day)
            ],
        },
    }
