"""A large, realistic incident ledger for benchmarks and scale tests, inserted by SQL.

One INSERT ... SELECT over generate_series: a million rows in about a minute on a small
machine (most of it the table's indexes), where ORM objects would take hours. Rows are
attached to the fleet as it is (nodes, GPUs, tenants, slices picked in SQL; none where
the fleet is empty), every row has its own target so any number may stay unresolved,
and the check constraints hold."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

# (rule, root cause, severity, what it is about, title, weight in a hundred): the mix of a
# fleet that mostly sees memory warnings and idle slices, and rarely a dead card.
CATALOG = [
    ("vram_high", "no_isolation", "warning", "gpu", "GPU VRAM at {n}%", 16),
    ("vram_critical", "no_isolation", "critical", "gpu", "GPU VRAM at {n}%: placements stopped", 4),
    ("quota_breach", "no_isolation", "critical", "slice", "Slice {n} over its VRAM quota", 8),
    ("process_jump", "app_parameters", "warning", "gpu", "Process {n} jumped 4096 MiB", 8),
    ("bandwidth_hog", "app_parameters", "warning", "slice", "Slice {n} uses 91% bandwidth", 4),
    ("orphan_process", "reclaim_failure", "warning", "gpu", "Process {n} belongs to no slice", 4),
    ("unattributed_memory", "reclaim_failure", "warning", "gpu", "{n} MiB used, no process", 3),
    ("hardware_fault", "hardware", "critical", "gpu", "Hardware fault on GPU {n}: Xid 79", 1),
    ("node_unreachable", "connectivity", "critical", "node", "Node {n} is unreachable", 3),
    ("node_gate_failed", "no_isolation", "warning", "node", "Node {n} failed its preflight", 1),
    ("quota_not_effective", "no_isolation", "warning", "node", "Node {n}: quota not enforced", 1),
    ("fleet_sweep", "no_isolation", "warning", "gpu", "Card at {n}%, up 6144 MiB in 300 s", 4),
    ("slow_leak", "reclaim_failure", "warning", "slice", "Slice {n} grows steadily", 6),
    ("accounting_drift", "no_isolation", "warning", "slice", "Slice {n}: NVML, library apart", 2),
    ("idle_slice", "reclaim_failure", "info", "slice", "Slice {n} idle for 15 min", 20),
    ("oom_exit", "app_parameters", "warning", "slice", "Slice {n} ended out of memory", 8),
    ("slice_preempted", "no_isolation", "warning", "slice", "Interruptible slice {n} preempted", 7),
]


def _evidence_templates() -> list[str]:
    """Sixteen evidence bodies: most a few hundred bytes, a few with a sample window of up
    to 110 points (about 4 KB) and the processes on the card. Each row adds its own times."""
    start = datetime(2024, 1, 1, tzinfo=UTC)
    out = []
    for k, points in enumerate([0] * 10 + [10, 20, 30, 40, 60, 110]):
        body: dict = {
            "used_mb": 8000 + 512 * k,
            "total_mb": 24576,
            "quota_mb": 8192,
            "percent": round(30 + 4.2 * k, 1),
            "window": [
                [(start + timedelta(seconds=10 * p)).isoformat(), 6000 + 37 * p + k]
                for p in range(points)
            ],
        }
        if k % 3 == 0:
            body["processes"] = [
                {"pid": 4000 + p, "used_mb": 512 * (p + 1), "container_id": f"{p:02d}" * 32}
                for p in range(1 + k // 3)
            ]
        out.append(json.dumps(body))
    return out


# Every random draw is made once per row (r[1..8]) so that the fields of a row agree:
# the rule decides the links and the title, the status the times that follow.
SEED_SQL = """
WITH fleet AS (
    SELECT
        (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM nodes_node) AS node_ids,
        (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM nodes_gpu) AS gpu_ids,
        (SELECT coalesce(array_agg(node_id ORDER BY id), '{{}}') FROM nodes_gpu) AS gpu_nodes,
        (SELECT coalesce(array_agg(s.id ORDER BY s.id), '{{}}') FROM tenants_slice s)
            AS slice_ids,
        (SELECT coalesce(array_agg(s.tenant_id ORDER BY s.id), '{{}}') FROM tenants_slice s)
            AS slice_tenants,
        (SELECT coalesce(array_agg(a.gpu_id ORDER BY s.id), '{{}}')
           FROM tenants_slice s LEFT JOIN nodes_allocation a ON a.id = s.allocation_id)
            AS slice_gpus,
        (SELECT coalesce(array_agg(g.node_id ORDER BY s.id), '{{}}')
           FROM tenants_slice s LEFT JOIN nodes_allocation a ON a.id = s.allocation_id
           LEFT JOIN nodes_gpu g ON g.id = a.gpu_id) AS slice_nodes
),
catalog (k, rule, root_cause, severity, scope, title) AS (VALUES {catalog}),
draws AS (
    SELECT i, ARRAY[random(), random(), random(), random(), random(), random(), random(),
                    random()] AS r
    FROM generate_series(1, %(count)s) AS i
),
picked AS (
    SELECT d.i, d.r, c.*,
        -- first seen in the order of the ids, as a ledger fills: indexes on time grow at
        -- their end, and the table is in time order as a real one is
        %(until)s::timestamptz
            - (1 - (d.i - d.r[2]) / %(count)s) * %(days)s * interval '1 day' AS first_seen,
        CASE WHEN d.r[4] < 0.03 THEN 'open' WHEN d.r[4] < 0.05 THEN 'acknowledged'
             WHEN d.r[4] < 0.08 THEN 'mitigated' ELSE 'resolved' END AS status,
        -- one in twenty has lost its links (a slice or node deleted since)
        d.r[6] >= 0.05 AS linked,
        1 + floor(d.r[3] * greatest(cardinality(f.slice_ids), 1))::int AS s,
        1 + floor(d.r[3] * greatest(cardinality(f.gpu_ids), 1))::int AS g,
        1 + floor(d.r[3] * greatest(cardinality(f.node_ids), 1))::int AS n,
        f.*
    FROM draws d
    JOIN catalog c ON c.k = (%(weights)s::int[])[1 + (d.r[1] * %(spread)s)::int %% %(spread)s]
    CROSS JOIN fleet f
),
linked AS (
    SELECT p.*,
        CASE WHEN linked AND scope = 'slice' THEN slice_ids[s] END AS slice_id,
        CASE WHEN linked AND scope = 'slice' THEN slice_tenants[s] END AS tenant_id,
        CASE WHEN linked AND scope = 'slice' THEN slice_gpus[s]
             WHEN linked AND scope = 'gpu' THEN gpu_ids[g] END AS gpu_id,
        CASE WHEN linked AND scope = 'slice' THEN slice_nodes[s]
             WHEN linked AND scope = 'gpu' THEN gpu_nodes[g]
             WHEN linked AND scope = 'node' THEN node_ids[n] END AS node_id,
        -- an unresolved incident is recent; a resolved one lasted minutes to hours
        CASE WHEN status = 'resolved'
             THEN least(first_seen + r[5] ^ 3 * interval '6 hours', %(until)s::timestamptz)
             ELSE greatest(first_seen, %(until)s::timestamptz - r[5] * interval '6 hours')
        END AS last_seen,
        -- most carry when the condition began; idle slices a quarter of an hour before
        CASE WHEN r[7] < 0.85
             THEN first_seen - r[8] * CASE WHEN rule = 'idle_slice' THEN interval '15 minutes'
                                           ELSE interval '3 minutes' END
        END AS began
    FROM picked p
)
INSERT INTO incidents_incident (
    rule, target_key, title, root_cause, severity, status, tenant_id, node_id, gpu_id,
    slice_id, evidence, first_seen_at, last_seen_at, occurrences, acknowledged_at,
    resolved_at, resolution_note, condition_since
)
SELECT
    rule,
    -- a target of its own: any number of them may be unresolved at once
    format('%%s:%%s:seed-%%s-%%s', scope, coalesce(slice_id, gpu_id, node_id, 0),
           %(batch)s::text, i),
    replace(title, '{{n}}', coalesce(slice_id, gpu_id, node_id, i)::text),
    root_cause,
    severity,
    status,
    tenant_id,
    node_id,
    gpu_id,
    slice_id,
    -- one concatenation: each || decodes and writes the whole document again
    (%(templates)s::jsonb[])[1 + i %% 16] || jsonb_build_object(
        'detail', 'Seeded for a benchmark: ' || rule,
        'detected_at', to_char(first_seen AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
        'pid', 1000 + i %% 30000,
        'condition_since', to_char(began AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))
        - CASE WHEN began IS NULL THEN 'condition_since' ELSE '' END,
    first_seen,
    last_seen,
    1 + floor(r[7] ^ 4 * 400)::int,
    -- acknowledged ones were, and most of those mitigated or resolved since
    CASE WHEN status = 'acknowledged' OR (status <> 'open' AND r[8] < 0.7)
         THEN least(first_seen + interval '4 minutes', last_seen) END,
    CASE WHEN status = 'resolved'
         THEN least(last_seen + r[8] * interval '20 minutes', %(until)s::timestamptz) END,
    CASE WHEN status = 'resolved' THEN 'Condition cleared: ' || rule || '.' ELSE '' END,
    began
FROM linked
"""


def _literal(text: str) -> str:
    # a constant of CATALOG as SQL; % doubled, as the driver reads the rest for parameters
    return "'" + text.replace("'", "''").replace("%", "%%") + "'"


def seed_incidents(*, count: int, days: int = 90, until: datetime | None = None) -> int:
    """Insert `count` incidents first seen over the `days` before `until` (now by
    default); returns how many were inserted."""
    if count <= 0:
        return 0
    until = until or timezone.now()
    weights = [k for k, row in enumerate(CATALOG) for _ in range(row[-1])]
    catalog = ", ".join(
        f"({k}, {', '.join(_literal(v) for v in row[:5])})" for k, row in enumerate(CATALOG)
    )
    sql = SEED_SQL.format(catalog=catalog)
    params = {
        "count": count,
        "days": days,
        "until": until,
        "weights": weights,
        "spread": len(weights),
        "templates": _evidence_templates(),
        "batch": str(time.time_ns()),
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
