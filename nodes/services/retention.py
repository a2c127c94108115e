"""Telemetry over time: raw samples rolled up to five minutes and to days in the database,
partitions made ahead, and retention (nodes/partitions.py keeps the tables).

Every rollup is one `INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE` over a
bounded window of raw rows: the database aggregates, Python never holds the rows, and a
window rolled twice gives the same rows (safe to run twice, as every task must be).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from .. import partitions
from ..models import GpuDayRollup, GpuSample, GpuSampleRollup, RollupProgress

logger = logging.getLogger(__name__)

BUCKET = timedelta(minutes=5)
# Raw rows rolled up per statement: an hour of a 1,000-node fleet is about a million GPU
# rows, which PostgreSQL aggregates in a second or two with bounded memory.
ROLLUP_WINDOW = timedelta(hours=1)
# One run stops starting windows after this long (the task's soft limit is 240 s); a
# backlog is worked off over the next runs.
ROLLUP_BUDGET_S = 150.0
# Sample rows are stamped with the platform's receive time before their transaction
# commits: a batch in flight while a rollup ran lands in a bucket already rolled. Each
# run rolls the last bucket again, so such a row is counted at the next run.
LATE_ROWS = BUCKET
PROGRESS = "gpu_5min"


def _bucket_sql(column: str) -> str:
    if connection.vendor == "postgresql":
        return f"date_bin('5 minutes', {column}, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
    # SQLite keeps datetimes as UTC text; '%%s' is strftime's '%s' once the backend has
    # turned its query parameters into '?'
    return f"datetime((CAST(strftime('%%s', {column}) AS INTEGER) / 300) * 300, 'unixepoch')"


def _day_sql(column: str) -> str:
    if connection.vendor == "postgresql":
        return f"({column} AT TIME ZONE 'UTC')::date"
    return f"date({column})"


def _greatest(a: str, b: str) -> str:
    return f"GREATEST({a}, {b})" if connection.vendor == "postgresql" else f"max({a}, {b})"


def _least(a: str, b: str) -> str:
    return f"LEAST({a}, {b})" if connection.vendor == "postgresql" else f"min({a}, {b})"


def _params(*moments: datetime) -> list:
    # Raw SQL gets no field adaptation: on SQLite an aware datetime would compare as text
    # with its "+00:00" against the stored naive UTC text, and lose at equality.
    return [connection.ops.adapt_datetimefield_value(m) for m in moments]


def _floor(moment: datetime) -> datetime:
    return moment - timedelta(seconds=moment.timestamp() % BUCKET.total_seconds())


def samples_rollup_window(*, since: datetime, until: datetime) -> int:
    """Roll the raw GPU samples of [since, until) (five-minute aligned) into their
    buckets and fold those buckets into days; returns the buckets written."""
    raw, rollups = GpuSample._meta.db_table, GpuSampleRollup._meta.db_table
    bucket = _bucket_sql("taken_at")
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {rollups} (gpu_id, bucket_start, samples, memory_total_mb, "  # noqa: S608
            "memory_used_max_mb, memory_used_mean_mb, utilization_gpu_max, "
            "utilization_gpu_mean) "
            f"SELECT gpu_id, {bucket}, count(*), max(memory_total_mb), max(memory_used_mb), "
            "avg(memory_used_mb), max(utilization_gpu), avg(utilization_gpu) "
            f"FROM {raw} WHERE taken_at >= %s AND taken_at < %s GROUP BY gpu_id, {bucket} "
            "ON CONFLICT (gpu_id, bucket_start) DO UPDATE SET samples = excluded.samples, "
            "memory_total_mb = excluded.memory_total_mb, "
            "memory_used_max_mb = excluded.memory_used_max_mb, "
            "memory_used_mean_mb = excluded.memory_used_mean_mb, "
            "utilization_gpu_max = excluded.utilization_gpu_max, "
            "utilization_gpu_mean = excluded.utilization_gpu_mean",
            _params(since, until),
        )
        written = cursor.rowcount
    rollups_fold_days(since=since, until=until)
    return written


def rollups_fold_days(*, since: datetime, until: datetime) -> None:
    """Fold the five-minute rollups of [since, until) into each GPU's day: the day keeps
    the highest peak, the earliest and the latest bucket it has seen, so folding a
    window again, or a window that overlaps one folded before, changes nothing."""
    days, rollups = GpuDayRollup._meta.db_table, GpuSampleRollup._meta.db_table
    day = _day_sql("bucket_start")
    merge = {
        "memory_total_mb": _greatest,
        "memory_used_max_mb": _greatest,
        "first_bucket_start": _least,
        "last_bucket_start": _greatest,
    }
    updates = ", ".join(f"{c} = {f(f'{days}.{c}', f'excluded.{c}')}" for c, f in merge.items())
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {days} (gpu_id, day, memory_total_mb, memory_used_max_mb, "  # noqa: S608
            "first_bucket_start, last_bucket_start) "
            f"SELECT gpu_id, {day}, max(memory_total_mb), max(memory_used_max_mb), "
            "min(bucket_start), max(bucket_start) "
            f"FROM {rollups} WHERE bucket_start >= %s AND bucket_start < %s "
            f"GROUP BY gpu_id, {day} ON CONFLICT (gpu_id, day) DO UPDATE SET {updates}",
            _params(since, until),
        )


@dataclass
class RollupRun:
    rolled_through: datetime
    buckets: int = 0
    windows: int = 0


def samples_rollup(*, until: datetime, budget_s: float | None = None) -> RollupRun:
    """Roll up every complete bucket before `until`, window by window from where the last
    run stopped, each window with its progress in one transaction (a run killed midway
    loses nothing and doubles nothing)."""
    complete_before = _floor(until)
    progress = RollupProgress.objects.filter(series=PROGRESS).first()
    if progress is not None:
        since = progress.rolled_through - LATE_ROWS
    else:  # first run: from the oldest raw row there is
        first = GpuSample.objects.order_by("taken_at").values_list("taken_at", flat=True).first()
        since = _floor(first) if first is not None else complete_before
    since = _floor(since)
    # nothing before the first raw row needs rolling: rolled through there
    run = RollupRun(rolled_through=progress.rolled_through if progress else since)
    deadline = time.monotonic() + (ROLLUP_BUDGET_S if budget_s is None else budget_s)
    while since < complete_before and time.monotonic() < deadline:
        end = min(since + ROLLUP_WINDOW, complete_before)
        with transaction.atomic():
            run.buckets += samples_rollup_window(since=since, until=end)
            RollupProgress.objects.update_or_create(
                series=PROGRESS, defaults={"rolled_through": end}
            )
        run.windows += 1
        run.rolled_through = since = end
    if since < complete_before:
        logger.warning("rollups are behind: stopped at %s, %s to go", since, complete_before)
    return run


def samples_rollup_and_prune(*, now: datetime | None = None) -> dict[str, int]:
    """The periodic telemetry upkeep: partitions made ahead, raw samples rolled up, then
    whatever is past retention dropped (raw rows only once they are rolled up)."""
    now = now or timezone.now()
    made = partitions.partitions_ensure(
        start=now - timedelta(hours=settings.NODES_RAW_PARTITION_HOURS),
        end=now + partitions.MADE_AHEAD,
    )
    run = samples_rollup(until=now)
    raw_cutoff = now - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS)
    rollup_cutoff = now - timedelta(days=settings.NODES_ROLLUP_RETENTION_DAYS)
    rolled = run.rolled_through - LATE_ROWS
    gpu_series, process_series = partitions.raw_series()
    rollup_series = partitions.rollup_series()
    dropped = partitions.partitions_drop_before(
        [
            (gpu_series, min(raw_cutoff, rolled)),
            (process_series, raw_cutoff),
            (rollup_series, rollup_cutoff),
        ]
    )
    raw, process, rollups = (dropped[s.table] for s in (gpu_series, process_series, rollup_series))
    days, _ = GpuDayRollup.objects.filter(day__lt=rollup_cutoff.date()).delete()
    return {
        "partitions_made": made,
        "rollups": run.buckets,
        "rollup_windows": run.windows,
        "raw_partitions_dropped": raw.partitions,
        "raw_deleted": raw.rows_deleted,
        "process_partitions_dropped": process.partitions,
        "process_deleted": process.rows_deleted,
        "rollup_partitions_dropped": rollups.partitions,
        "rollups_deleted": rollups.rows_deleted,
        "day_rollups_deleted": days,
        "bytes_freed": raw.bytes + process.bytes + rollups.bytes,
    }
