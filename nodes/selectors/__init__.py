"""Reads of the fleet for pages, API and /metrics: one query shape each. The two policies'
reads (the preflight policy row, the overcommit advice) are in `policies`, named here too."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple, TypedDict

from django.conf import settings
from django.db import connection
from django.db.models import (
    Avg,
    Count,
    F,
    FloatField,
    Max,
    Min,
    Prefetch,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.expressions import CombinedExpression, RawSQL
from django.db.models.functions import Cast, Coalesce
from django.db.models.lookups import GreaterThanOrEqual
from django.utils import timezone

from ..image_refs import node_holds
from ..models import (
    AGENT_BLOCKS,
    AgentEntry,
    AgentState,
    Allocation,
    GateStatus,
    Gpu,
    GpuSample,
    GpuSampleRollup,
    Node,
    NodeAgent,
    NodePolicyChange,
    ProcessSample,
)
from ..placement_sql import SOLD_ROOM_SQL
from .policies import gpu_recommended_ratio as gpu_recommended_ratio
from .policies import preflight_policy as preflight_policy
from .policies import rollup_windows as rollup_windows

MAX_POINTS = 500


def gpu_shapes_in_service() -> list[dict]:
    """One row per distinct card shape that takes placements now (model, size, MIG layout,
    whole-card rule): what the tier catalog says each tier runs on. One query."""
    rows = (
        Gpu.objects.taking_placements()
        .values_list("model", "vram_total_mb", "mig_enabled", "whole_card_only", "mig_devices")
        .order_by("model")
    )
    shapes: dict[tuple, dict] = {}
    for model, total_mb, mig_enabled, whole, devices in rows:
        sizes = tuple(sorted(int(d.get("memory_total_mb") or 0) for d in devices or []))
        key = (model, total_mb, mig_enabled, whole, sizes if mig_enabled else ())
        shape = shapes.setdefault(
            key,
            {
                "model": model,
                "total_mb": total_mb,
                "mig_enabled": mig_enabled,
                "whole_card_only": whole,
                "mig_sizes_mb": key[4],
                "count": 0,
            },
        )
        shape["count"] += 1
    return list(shapes.values())


def node_list() -> QuerySet[Node]:
    return Node.objects.prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.filter(present=True).order_by("index"))
    ).order_by("name")


def node_policy_changes() -> QuerySet[NodePolicyChange]:
    return NodePolicyChange.objects.select_related("changed_by", "node").order_by(
        "-changed_at", "-pk"
    )


def gpu_list(*, node_id: int | None = None) -> QuerySet[Gpu]:
    qs = Gpu.objects.select_related("node").order_by("node__name", "index")
    return qs.filter(node_id=node_id) if node_id else qs


class InterruptibleCounts(TypedDict):
    held: int  # interruptible reservations held now
    preempted_7d: int  # taken back by the watchdog in the last 7 days
    preempted_30d: int


def interruptible_counts(
    *, gpu_ids: list[int], now: datetime | None = None
) -> dict[int, InterruptibleCounts]:
    """Per GPU: interruptible reservations held now and how many the watchdog took back
    in the last 7 and 30 days (what the overcommit page shows). One query."""
    now = now or timezone.now()
    week, month = now - timedelta(days=7), now - timedelta(days=30)
    rows = (
        Allocation.objects.filter(gpu_id__in=gpu_ids, interruptible=True)
        .filter(Q(preempted_at__gte=month) | ~Q(state=Allocation.State.RELEASED))
        .values("gpu_id")
        .annotate(
            held=Count("pk", filter=~Q(state=Allocation.State.RELEASED)),
            preempted_7d=Count("pk", filter=Q(preempted_at__gte=week)),
            preempted_30d=Count("pk", filter=Q(preempted_at__gte=month)),
        )
    )
    out: dict[int, InterruptibleCounts] = {
        pk: {"held": 0, "preempted_7d": 0, "preempted_30d": 0} for pk in gpu_ids
    }
    for row in rows:
        out[row["gpu_id"]] = {
            "held": row["held"],
            "preempted_7d": row["preempted_7d"],
            "preempted_30d": row["preempted_30d"],
        }
    return out


# --- the fleet page: totals, one heatmap cell per node, a page of the GPU table ----------

GPU_FILTERS = {
    "all": "all GPUs",
    "closed": "not accepting placements",
    "hot": "over the {pct}% warning line",  # the watchdog's line: nodes.warning_line
    "unsampled": "no sample yet",
}
GPU_SORTS = {"hot": "hottest first", "node": "by node"}
# What a row of the fleet's GPU table shows; the nodes' JSON (preflight, images) stays out.
GPU_ROW_FIELDS = (
    "index", "model", "vram_total_mb", "mig_enabled", "whole_card_only", "allocated_mb",
    "accepting_placements", "not_accepting_reason", "last_memory_used_mb",
    "last_utilization_gpu", "last_sample_at", "node__name", "node__status",
    "node__status_reason", "node__last_error", "node__drained_at", "node__drain_reason",
    "node__gate_status", "node__gate_reason",
)  # fmt: skip


def _used_pct(prefix: str = "") -> CombinedExpression:
    """VRAM used, % of the card's total, in SQL: NULL without a sample. The same double
    Python's 100 * used / total gives, so rounding it there draws the same number."""
    return Cast(f"{prefix}last_memory_used_mb", FloatField()) * 100 / F(f"{prefix}vram_total_mb")


def _hot_q(line: float, prefix: str = "") -> Q:
    # Without a division: exactly the watchdog's `100 * used / total >= line`.
    return Q(
        GreaterThanOrEqual(
            F(f"{prefix}last_memory_used_mb") * 100,
            F(f"{prefix}vram_total_mb") * Value(line, output_field=FloatField()),
        )
    )


def _closed_q() -> Q:
    """A present GPU that no new slice lands on: the complement of `taking_placements`."""
    return (
        Q(accepting_placements=False)
        | ~Q(node__status=Node.Status.ACTIVE)
        | Q(node__drained_at__isnull=False)
        | ~Q(node__gate_status=GateStatus.PASSED)
        | Q(node__agent__state__in=AGENT_BLOCKS)
    )


def fleet_totals(*, warning_pct: float) -> dict:
    """Counts and VRAM sums of the whole fleet, aggregated in the database. Two queries."""
    # (the aggregates' names differ from the fields': a filter below reads the fields)
    gpus = Gpu.objects.filter(present=True).aggregate(
        n_gpus=Count("pk"),
        sum_total=Coalesce(Sum("vram_total_mb"), 0),
        sum_used=Coalesce(Sum("last_memory_used_mb"), 0),
        sum_allocated=Coalesce(Sum("allocated_mb"), 0),
        n_closed=Count("pk", filter=_closed_q()),
        n_hot=Count("pk", filter=_hot_q(warning_pct)),
        n_unsampled=Count("pk", filter=Q(last_memory_used_mb__isnull=True)),
    )
    nodes = Node.objects.aggregate(
        n_nodes=Count("pk"), **{s: Count("pk", filter=Q(status=s)) for s in Node.Status.values}
    )
    return {
        "nodes": nodes.pop("n_nodes"),
        "by_status": {s: n for s, n in nodes.items() if n},
        "gpus": gpus["n_gpus"],
        "vram_total_mb": gpus["sum_total"],
        "vram_used_mb": gpus["sum_used"],
        "vram_allocated_mb": gpus["sum_allocated"],
        "closed": gpus["n_closed"],
        "hot": gpus["n_hot"],
        "unsampled": gpus["n_unsampled"],
    }


class NodeRow(NamedTuple):
    """One node as the fleet heatmap draws it: the node's own fields that say whether it
    takes placements, and aggregates over its present GPUs."""

    pk: int
    name: str
    status: str
    status_reason: str
    last_error: str
    drained_at: datetime | None
    drain_reason: str
    gate_status: str
    gate_reason: str
    gpus: int
    sampled: int
    hottest_pct: float | None  # the hottest card's VRAM used, % of its total
    mean_pct: float | None  # over the cards with a sample
    hot: int  # cards at or over the warning line
    closed: int  # cards that take no placements themselves
    closed_index: int | None  # the lowest index among them
    closed_reason: str | None  # one of their reasons
    allocated_mb: int | None
    total_mb: int | None


def fleet_nodes(*, warning_pct: float) -> list[NodeRow]:
    """Every node, by name, with what its heatmap cell shows. One query, one row a node:
    the per-GPU work is the database's aggregate, not Python's."""
    present = Q(gpus__present=True)
    closed = present & Q(gpus__accepting_placements=False)
    rows = (
        Node.objects.order_by("name")
        .values_list(*NodeRow._fields[:9])
        .annotate(
            n_gpus=Count("gpus", filter=present),
            n_sampled=Count("gpus__last_memory_used_mb", filter=present),
            hottest=Max(_used_pct("gpus__"), filter=present),
            mean=Avg(_used_pct("gpus__"), filter=present),
            n_hot=Count("gpus", filter=present & _hot_q(warning_pct, "gpus__")),
            n_closed=Count("gpus", filter=closed),
            first_closed=Min("gpus__index", filter=closed),
            a_reason=Min("gpus__not_accepting_reason", filter=closed),
            allocated=Sum("gpus__allocated_mb", filter=present),
            total=Sum("gpus__vram_total_mb", filter=present),
        )
    )
    return [NodeRow._make(row) for row in rows]


def fleet_gpu_rows(*, filter: str = "all", sort: str = "hot", warning_pct: float) -> QuerySet[Gpu]:
    """The fleet's GPU table: present GPUs with their node, filtered and sorted as asked
    (unknown values read as the defaults); the page paginates it."""
    qs = Gpu.objects.filter(present=True).select_related("node").only(*GPU_ROW_FIELDS)
    if filter == "closed":
        qs = qs.filter(_closed_q())
    elif filter == "hot":
        qs = qs.filter(_hot_q(warning_pct))
    elif filter == "unsampled":
        qs = qs.filter(last_memory_used_mb__isnull=True)
    if sort == "node":
        return qs.order_by("node__name", "index")
    return qs.alias(used_pct=_used_pct()).order_by(
        F("used_pct").desc(nulls_last=True), "node__name", "index"
    )


def latest_processes(*, gpu_ids: list[int]) -> dict[int, list[ProcessSample]]:
    """The processes of each GPU's latest sample, with the owner key of their container."""
    gpus = Gpu.objects.filter(pk__in=gpu_ids, last_sample_at__isnull=False)
    out: dict[int, list[ProcessSample]] = {g: [] for g in gpu_ids}
    cond = Q()
    for gpu in gpus:
        cond |= Q(gpu_id=gpu.pk, taken_at=gpu.last_sample_at)
    if not cond:
        return out
    rows = list(ProcessSample.objects.filter(cond).order_by("gpu_id", "-used_memory_mb"))
    owners = dict(
        Allocation.objects.filter(container_id__in={r.container_id for r in rows if r.container_id})
        .exclude(state=Allocation.State.RELEASED)
        .values_list("container_id", "owner_key")
    )
    for row in rows:
        # shown beside the sample's own fields (the node page): not a column
        row.owner_key = owners.get(row.container_id, "")  # type: ignore[attr-defined]
        out.setdefault(row.gpu_id, []).append(row)
    return out


@dataclass
class Point:
    t: datetime
    used_mb: float
    used_max_mb: float
    util: float | None


def gpu_series(*, gpu: Gpu, start: datetime, end: datetime, max_points: int = MAX_POINTS) -> dict:
    """VRAM used (mean and max) and utilization over [start, end], at most max_points.

    Raw samples where they are kept; five-minute rollups for older ranges."""
    raw_from = timezone.now() - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS)
    rows: list[tuple[datetime, float, float, float | None]] = []
    if start < raw_from:
        rows += [
            (r.bucket_start, r.memory_used_mean_mb, r.memory_used_max_mb, r.utilization_gpu_mean)
            for r in GpuSampleRollup.objects.filter(
                gpu=gpu, bucket_start__gte=start, bucket_start__lt=min(end, raw_from)
            ).order_by("bucket_start")
        ]
    rows += [
        (t, float(u), float(u), util)
        for t, u, util in GpuSample.objects.filter(
            gpu=gpu, taken_at__gte=max(start, raw_from) if rows else start, taken_at__lte=end
        )
        .order_by("taken_at")
        .values_list("taken_at", "memory_used_mb", "utilization_gpu")
    ]
    points = downsample(rows, start=start, end=end, max_points=max_points)
    return {
        "gpu": gpu.pk,
        "start": start,
        "end": end,
        "memory_total_mb": gpu.vram_total_mb,
        "points": [
            {
                "t": p.t,
                "used_mb": round(p.used_mb, 1),
                "used_max_mb": p.used_max_mb,
                "util": None if p.util is None else round(p.util, 1),
            }
            for p in points
        ],
    }


def downsample(
    rows: Sequence[tuple[datetime, float, float, float | None]],
    *,
    start: datetime,
    end: datetime,
    max_points: int,
) -> list[Point]:
    """Fold (t, mean, max, util) rows into at most max_points equal time buckets."""
    if len(rows) <= max_points:
        return [Point(t, m, mx, u) for t, m, mx, u in rows]
    width = max((end - start).total_seconds() / max_points, 1e-6)
    buckets: dict[int, list[tuple[float, float, float | None]]] = {}
    for t, mean, peak, util in rows:
        index = min(int((t - start).total_seconds() / width), max_points - 1)
        buckets.setdefault(index, []).append((mean, peak, util))
    points = []
    for index in sorted(buckets):
        items = buckets[index]
        utils = [u for _, _, u in items if u is not None]
        points.append(
            Point(
                t=start + timedelta(seconds=index * width),
                used_mb=sum(m for m, _, _ in items) / len(items),
                used_max_mb=max(p for _, p, _ in items),
                util=sum(utils) / len(utils) if utils else None,
            )
        )
    return points


# --- /metrics: per-GPU gauges in the style of NVIDIA's DCGM exporter ----------------------

# (name, HELP text) in the order the families are written; every family is a gauge.
METRIC_FAMILIES = (
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB)."),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("gpuplatform_gpu_allocated_mib", "VRAM reserved by slices (in MiB)."),
    ("gpuplatform_gpu_sample_age_seconds", "Seconds since the last sample."),
    ("gpuplatform_gpu_accepting_placements", "1 if new slices may land here."),
)
NODE_STATUS_HELP = "1 for the node's current status."
METRIC_GPU_FIELDS = (
    "node_id", "index", "uuid", "model", "vram_total_mb", "allocated_mb", "accepting_placements",
    "last_sample_at", "last_memory_used_mb", "last_utilization_gpu", "last_utilization_memory",
    "last_temperature_c", "last_power_w",
)  # fmt: skip


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def metrics_text(*, now: datetime) -> str:
    """The /metrics exposition at `now`. On PostgreSQL the database writes it in one
    query; elsewhere (SQLite) Python does, to the same bytes."""
    if connection.vendor == "postgresql":
        text = _metrics_text_sql(now=now)
        if text is not None:
            return text
    return _metrics_text_python(now=now)


def _metrics_text_python(*, now: datetime) -> str:
    gpus = (
        Gpu.objects.filter(present=True)
        .order_by("node__name", "index")
        .values_list(*METRIC_GPU_FIELDS)
    )
    nodes = list(Node.objects.order_by("name").values_list("pk", "name", "status"))
    hostnames = {pk: _label(name) for pk, name, _ in nodes}
    lines: dict[str, list[str]] = {name: [] for name, _ in METRIC_FAMILIES}
    for (
        node_id, index, uuid, model, total, allocated, accepting, sampled_at, used, util,
        mem_util, temp, power,
    ) in gpus:  # fmt: skip
        labels = (
            f'gpu="{index}",UUID="{_label(uuid)}",modelName="{_label(model)}",'
            f'Hostname="{hostnames[node_id]}"'
        )
        values: dict[str, object] = {
            "DCGM_FI_DEV_FB_TOTAL": total,
            "gpuplatform_gpu_allocated_mib": allocated or 0,
            "gpuplatform_gpu_accepting_placements": int(accepting),
        }
        if sampled_at:
            used = used or 0
            values.update(
                {
                    "DCGM_FI_DEV_FB_USED": used,
                    "DCGM_FI_DEV_FB_FREE": max(total - used, 0),
                    "DCGM_FI_DEV_GPU_UTIL": util,
                    "DCGM_FI_DEV_MEM_COPY_UTIL": mem_util,
                    "DCGM_FI_DEV_GPU_TEMP": temp,
                    "DCGM_FI_DEV_POWER_USAGE": power,
                    "gpuplatform_gpu_sample_age_seconds": round(
                        (now - sampled_at).total_seconds(), 1
                    ),
                }
            )
        for name, value in values.items():
            if value is not None:
                lines[name].append(f"{name}{{{labels}}} {value}")
    out = []
    for name, help_text in METRIC_FAMILIES:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *lines[name]]
    out += [
        f"# HELP gpuplatform_node_status {NODE_STATUS_HELP}",
        "# TYPE gpuplatform_node_status gauge",
        *(
            f'gpuplatform_node_status{{Hostname="{hostnames[pk]}",status="{status}"}} '
            f"{1 if node_status == status else 0}"
            for pk, _, node_status in nodes
            for status in Node.Status.values
        ),
    ]
    return "\n".join(out) + "\n"


# The same text written by PostgreSQL, a family at a time (string_agg skips the NULLs
# of a GPU that lacks the value). Each value is formatted as Python's str() would:
# integers as they are; a float as its shortest repr (PostgreSQL 12+ prints the same
# digits, without the ".0" of a whole number, and writes nan and inf its own way); the
# sample age rounded to 0.1 s as Python's round() rounds the double, ties included.
_METRIC_VALUES_SQL = (
    "CASE WHEN sampled THEN used::text END",
    "CASE WHEN sampled THEN greatest(total - used, 0)::text END",
    "total::text",
    "CASE WHEN sampled THEN last_utilization_gpu::text END",
    "CASE WHEN sampled THEN last_utilization_memory::text END",
    "CASE WHEN sampled THEN last_temperature_c::text END",
    """CASE WHEN sampled THEN CASE
        WHEN power = 'NaN'::float8 THEN 'nan'
        WHEN power = 'Infinity'::float8 THEN 'inf'
        WHEN power = '-Infinity'::float8 THEN '-inf'
        WHEN power::text ~ '^-?[0-9]+$' THEN power::text || '.0'
        ELSE power::text END END""",
    "allocated_mb::text",
    """CASE WHEN sampled THEN CASE WHEN age_us < 0 THEN '-' ELSE '' END
        || (tenths / 10) || '.' || mod(tenths, 10) END""",
    "CASE WHEN accepting_placements THEN '1' ELSE '0' END",
)
assert len(_METRIC_VALUES_SQL) == len(METRIC_FAMILIES)

_METRICS_SQL = r"""
WITH gpu AS (
    SELECT *,
        b / 100000 + CASE
            WHEN mod(b, 100000) > 50000 THEN 1
            WHEN mod(b, 100000) < 50000 THEN 0
            -- A tie in decimal (b ends in 50000): Python rounds the double fl(b / 1e6),
            -- which lies on one side of it, found exactly with Dekker's product:
            -- sign(fl(b / 1e6) * 1e6 - b). On it exactly (.25, .75): to even.
            ELSE CASE sign(
                (x * 1000000::float8 - b::float8)
                + ((xh * 1000000::float8 - x * 1000000::float8) + (x - xh) * 1000000::float8)
            ) WHEN 1 THEN 1 WHEN -1 THEN 0 ELSE mod(b / 100000, 2) END
        END AS tenths
    FROM (
        SELECT *, c - (c - x) AS xh  -- Veltkamp's split of x: its upper 26 bits
        FROM (
            SELECT *, abs(age_us)::float8 / 1000000::float8 AS x,
                134217729::float8 * (abs(age_us)::float8 / 1000000::float8) AS c,
                abs(age_us) AS b
            FROM (
                SELECT
                    row_number() OVER (ORDER BY n.name, g.index) AS ord,
                    '{gpu="' || g.index || '",UUID="' || @ESC(g.uuid) || '",modelName="'
                        || @ESC(g.model) || '",Hostname="' || @ESC(n.name) || '"} ' AS labels,
                    g.last_sample_at IS NOT NULL AS sampled,
                    g.vram_total_mb AS total,
                    coalesce(g.last_memory_used_mb, 0) AS used,
                    g.allocated_mb, g.accepting_placements, g.last_utilization_gpu,
                    g.last_utilization_memory, g.last_temperature_c, g.last_power_w AS power,
                    -- microseconds since the sample, exactly (extract gives a numeric)
                    (extract(epoch FROM (%(now)s::timestamptz - g.last_sample_at)) * 1000000)
                        ::bigint AS age_us
                FROM nodes_gpu g JOIN nodes_node n ON n.id = g.node_id
                WHERE g.present
            ) base
        ) split
    ) parts
)
SELECT
    @FAMILIES,
    (SELECT string_agg(
        'gpuplatform_node_status{Hostname="' || name || '",status="' || s.status || '"} '
            || CASE WHEN n.status = s.status THEN '1' ELSE '0' END,
        E'\n' ORDER BY n.ord, s.ord)
     FROM (
        SELECT row_number() OVER (ORDER BY name) AS ord, @ESC(name) AS name, status
        FROM nodes_node
     ) n CROSS JOIN unnest(%(statuses)s::text[]) WITH ORDINALITY AS s(status, ord)),
    -- where PostgreSQL would not write a float as Python does, Python writes the text
    current_setting('extra_float_digits')::int > 0 AND NOT bool_or(
        sampled AND (
            abs(power) >= 1e15 AND abs(power) <> 'Infinity'::float8 AND power <> 'NaN'::float8
            OR b >= 1000000000000000
        )
    ) IS TRUE
FROM gpu
"""


def _sql_escape(column: str) -> str:
    # `_label` in SQL: backslash, then double quote, escaped; a newline becomes a space.
    return (
        f"replace(replace(replace({column}, chr(92), chr(92) || chr(92)), "
        f"'\"', chr(92) || '\"'), chr(10), ' ')"
    )


_METRICS_SQL = re.sub(r"@ESC\(([\w.]+)\)", lambda m: _sql_escape(m.group(1)), _METRICS_SQL).replace(
    "@FAMILIES",
    ",\n    ".join(
        f"string_agg((%(names)s::text[])[{k}] || labels || ({value}), E'\\n' ORDER BY ord)"
        for k, value in enumerate(_METRIC_VALUES_SQL, start=1)
    ),
)


def _metrics_text_sql(*, now: datetime) -> str | None:
    """The exposition written by PostgreSQL, or None where its text would differ from
    Python's (a float beyond 1e15, floats printed at a lower precision setting)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _METRICS_SQL,
            {
                "now": now,
                "names": [name for name, _ in METRIC_FAMILIES],
                "statuses": list(Node.Status.values),
            },
        )
        *families, statuses, exact = cursor.fetchone()
    if not exact:
        return None
    out = []
    for (name, help_text), lines in zip(METRIC_FAMILIES, families, strict=True):
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *([lines] if lines else [])]
    out += [
        f"# HELP gpuplatform_node_status {NODE_STATUS_HELP}",
        "# TYPE gpuplatform_node_status gauge",
        *([statuses] if statuses else []),
    ]
    return "\n".join(out) + "\n"


# --- sampling and images on the fleet -------------------------------------------------------


def sampleable_nodes() -> QuerySet[Node]:
    return Node.objects.exclude(host_key="").exclude(status=Node.Status.PENDING)


def nodes_can_pull() -> str:
    """Whether nodes can pull: "yes", "no" or "" (not known), as ops set it
    (GPUPLATFORM_NODES_CAN_PULL)."""
    return settings.NODES_CAN_PULL


def placement_nodes_with_images() -> int:
    """How many nodes taking placements now have had their images read."""
    node_ids = Gpu.objects.taking_placements().values_list("node_id", flat=True).distinct()
    return Node.objects.filter(pk__in=node_ids, images_read_at__isnull=False).count()


def images_on_placement_nodes(references: Iterable[str]) -> dict[str, int]:
    """For each reference, how many nodes that take placements now (a GPU of theirs does)
    hold it, by their last listing."""
    node_ids = Gpu.objects.taking_placements().values_list("node_id", flat=True).distinct()
    held = [
        set(images or ())
        for images in Node.objects.filter(pk__in=node_ids).values_list("images", flat=True)
    ]
    return {ref: sum(1 for h in held if node_holds(h, ref)) for ref in references}


# --- placement ------------------------------------------------------------------------------


def placeable_gpus(
    *,
    guaranteed: bool,
    node_id: int | None = None,
    interruptible: bool = False,
    agent_running: bool = False,
) -> QuerySet[Gpu]:
    """GPUs a new reservation may land on (`Gpu.objects.taking_placements`), on one node
    when `node_id` says (a slice mounting a node-local volume runs where the volume is),
    on nodes whose agent runs now when `agent_running` says (an image brought under
    "any image": docs/images.md)."""
    gpus = Gpu.objects.taking_placements()
    if node_id is not None:
        gpus = gpus.filter(node_id=node_id)
    if agent_running:
        gpus = gpus.filter(node__agent__state=AgentState.OK)
    if interruptible:
        # spare room of any software-sliced card (an overcommitted card's margin or an idle
        # card): a full-price launch that needs it preempts it (tenants' preempt_for_room)
        gpus = gpus.filter(mig_enabled=False)
    if guaranteed:
        # docs/domain.md: no overcommit for work that was sold as guaranteed.
        gpus = gpus.filter(overcommit_ratio=1)
    return gpus


def placement_shortfall(*, vram_mb: int, guaranteed: bool = True) -> str:
    """Why a launch that found no room waits, where the reason is memory the platform did
    not sell: a card with room by what was sold whose processes hold more. '' otherwise.
    Names no node or GPU (a tenant reads it)."""
    over = (
        placeable_gpus(guaranteed=guaranteed)
        .filter(mig_enabled=False)
        .annotate(sold_room=RawSQL(SOLD_ROOM_SQL[connection.vendor], ()))  # noqa: S611 - constant
        .filter(sold_room__gte=vram_mb, last_processes_mb__gt=F("allocated_mb"))
        .values_list("allocated_mb", "last_processes_mb")
    )
    # `held or 0`: the filter keeps only rows whose processes hold something
    extra = max(((held or 0) - sold for sold, held in over), default=0)
    if not extra:
        return ""
    return (
        f"A GPU with room for it by what was sold on it holds {extra} MiB more than that "
        "(memory used outside the platform), so nothing more is placed there for now."
    )


def node_agent(*, node_id: int) -> NodeAgent | None:
    """The node agent as the platform last judged it (None before its first check)."""
    return NodeAgent.objects.filter(node_id=node_id).first()


def node_agent_entries(*, node_id: int, limit: int = 10) -> list[AgentEntry]:
    """The agent's newest journal entries on this node, newest first (kills, harms,
    strays, restarts)."""
    return list(
        AgentEntry.objects.filter(node_id=node_id).exclude(kind="start").order_by("-pk")[:limit]
    )
