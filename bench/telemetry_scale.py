"""Telemetry at fleet scale, on PostgreSQL: a month of history for a fleet (five-minute
rollups for the month, raw GPU and process rows for the 48-hour retention, generated in
the database), then

- sustained ingest: rows/s through `samples_ingest` (COPY into the partitioned tables)
  with the month loaded, against the same ingest into the empty tables at the start of
  the run (baseline; ratio = loaded / empty, 1.0 means history costs ingest nothing);
- pruning one day of raw rows: detaching and dropping that day's partitions against
  DELETE of the same rows from an unpartitioned copy holding them (baseline;
  `prune_ratio` = DELETE time / drop time, target >= 100);
- rolling up one hour of the fleet's raw rows in the database (`INSERT ... SELECT ...
  ON CONFLICT`) against the way the platform did it before (the ORM aggregate read into
  Python, one model object per rollup, upserted back; ratio = before / now);
- the overcommit advisor for every GPU over 30 days, from the day rollups, against the
  same answer from the five-minute rollups (ratio = before / now);
and prints the tables' sizes before and after pruning.

    .venv/bin/python bench/telemetry_scale.py [--nodes 50] [--gpus 8] [--procs 1]

The default (50 nodes of 8 GPUs: 2.3 M raw rows, 3.5 M rollups) runs in about two
minutes here; the full fleet of the issue, `--nodes 1000` (46 M raw rows, 69 M rollups),
takes about an hour and some 40 GB of disk.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# bench/ is on sys.path; importing _db sets Django up, so it comes before the platform's
# imports below
from _db import sql, throwaway_database

# isort: split
from _fleet_seed import seed_fleet
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Avg, Count, DateTimeField, Func, Max, Min
from django.db.models.functions import TruncDate
from ingest import make_samples

from incidents.hooks import watchdog_sample_hook
from nodes import partitions, selectors, services
from nodes.hooks import register_sample_hook, unregister_sample_hook
from nodes.models import Gpu, GpuSample, GpuSampleRollup, Node
from nodes.services import retention
from nodes.services.sampling import PIPELINE_CHUNK

MONTH = timedelta(days=30)


def _sizes(label: str) -> dict[str, int]:
    out = {}
    for table in ("nodes_gpusample", "nodes_processsample", "nodes_gpusamplerollup"):
        out[table] = partitions.table_bytes(table)
    print(
        f"table sizes {label}: "
        + ", ".join(f"{t.removeprefix('nodes_')} {b / 2**20:,.0f} MiB" for t, b in out.items())
    )
    return out


@contextlib.contextmanager
def keys_and_indexes_deferred(tables: tuple[str, ...]):
    """Load history with the tables' keys, foreign keys and indexes off, then build them
    once over the loaded rows (what a bulk load does: several times faster than keeping
    every index up row by row). Not what the platform does: its rows arrive 30 s apart."""
    saved: list[tuple[str, str, str]] = []
    for table in tables:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'f')",
                [table],
            )
            constraints = cursor.fetchall()
            cursor.execute(
                "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i "
                "WHERE indrelid = %s::regclass AND NOT EXISTS "
                "(SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)",
                [table],
            )
            indexes = cursor.fetchall()
        for name, definition in constraints:
            sql(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
            saved.append(
                (table, name, f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}')
            )
        for name, definition in indexes:
            sql(f"DROP INDEX {name}")
            saved.append((table, name, definition))
    try:
        yield
    finally:
        for _, _, statement in saved:
            sql(statement)


def generate_history(*, now: datetime, procs: int) -> None:
    """A month of five-minute rollups and 48 hours of raw rows, written by the database
    day by day (hour by hour for raw rows): each GPU holds a steady share of its memory
    with noise, as a card serving one tenant's model does."""
    start = now - MONTH
    raw_from = now - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS)
    ahead = now + timedelta(days=1)
    partitions.partitions_ensure(start=start, end=ahead, series=(partitions.rollup_series(),))
    partitions.partitions_ensure(start=raw_from, end=ahead, series=partitions.raw_series())
    # '%%': these statements take parameters, so a literal percent sign is doubled
    used = "LEAST(g.vram_total_mb, (g.vram_total_mb * (0.2 + (g.id * 7919 %% 97) / 140.0)"
    tables = ("nodes_gpusamplerollup", "nodes_gpusample", "nodes_processsample")
    with keys_and_indexes_deferred(tables):
        _write_history(start=start, raw_from=raw_from, now=now, used=used, procs=procs)
    retention.rollups_fold_days(since=start, until=now)
    for table in (*tables, "nodes_gpudayrollup"):
        sql(f'ANALYZE "{table}"')


def _write_history(*, start, raw_from, now, used, procs) -> None:
    day = start
    while day < now:
        end = min(day + timedelta(days=1), now)
        sql(
            "INSERT INTO nodes_gpusamplerollup (gpu_id, bucket_start, samples, "  # noqa: S608
            "memory_total_mb, memory_used_max_mb, memory_used_mean_mb, utilization_gpu_max, "
            "utilization_gpu_mean) "
            f"SELECT g.id, t, 10, g.vram_total_mb, {used} + random() * 2048)::int), "
            f"{used})::int), (random() * 100)::int, random() * 60 "
            "FROM nodes_gpu g, generate_series(%s, %s - interval '1 second', "
            "interval '5 minutes') t",
            [day, end],
        )
        day = end
    hour = raw_from
    while hour < now:
        end = min(hour + timedelta(hours=1), now)
        sql(
            "INSERT INTO nodes_gpusample (gpu_id, taken_at, memory_used_mb, memory_total_mb, "  # noqa: S608
            "utilization_gpu, utilization_memory, temperature_c, power_w) "
            f"SELECT g.id, t, {used} + random() * 2048)::int), g.vram_total_mb, "
            "(random() * 100)::int, (random() * 60)::int, 40 + (random() * 30)::int, "
            "100 + random() * 300 FROM nodes_gpu g, "
            "generate_series(%s, %s - interval '1 second', interval '30 seconds') t",
            [hour, end],
        )
        sql(
            "INSERT INTO nodes_processsample (gpu_id, taken_at, pid, used_memory_mb, "
            "container_id, sm_utilization, memory_utilization) "
            "SELECT g.id, t, 1000 + p, 2000 + p * 100, md5(g.id::text || p::text), "
            "(random() * 100)::int, (random() * 50)::int FROM nodes_gpu g, "
            "generate_series(%s, %s - interval '1 second', interval '30 seconds') t, "
            "generate_series(1, %s) p",
            [hour, end, procs],
        )
        hour = end


def ingest_rate(*, rounds: int, procs: int) -> float:
    """Rows per second through samples_ingest, the fleet sampled `rounds` times in chunks
    as nodes_sample stores them. Storage alone: the watchdog's rules, which run on each
    batch through the sample hooks, are bench/detection.py's to measure (here they would
    file the first round's incidents in one phase and not the other)."""
    unregister_sample_hook(watchdog_sample_hook)
    try:
        return _ingest_rate(rounds=rounds, procs=procs)
    finally:
        register_sample_hook(watchdog_sample_hook)


def _ingest_rate(*, rounds: int, procs: int) -> float:
    nodes = list(Node.objects.order_by("pk"))
    gpus: dict[int, list[Gpu]] = {}
    for gpu in Gpu.objects.order_by("node_id", "index"):
        gpus.setdefault(gpu.node_id, []).append(gpu)
    rates = []  # the median round: a noisy neighbour on a shared machine moves the mean
    for _ in range(rounds):
        results = make_samples(nodes, gpus, procs_per_gpu=procs)
        rows, began = 0, time.perf_counter()
        for i in range(0, len(results), PIPELINE_CHUNK):
            batch = services.samples_ingest(results=results[i : i + PIPELINE_CHUNK])
            rows += len(batch.gpu_samples) + len(batch.process_samples)
        rates.append(rows / (time.perf_counter() - began))
    return statistics.median(rates)


def _wal_lsn() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


@dataclass
class Prune:
    rows: int
    dropped_s: float
    deleted_s: float
    vacuum_s: float
    dropped_wal: int
    deleted_wal: int


def prune_one_day(*, now: datetime) -> Prune:
    """One whole UTC day of raw rows (both raw tables) pruned: its partitions detached and
    dropped, against DELETE of the same rows from unpartitioned copies of the tables (same
    indexes, all 48 hours in them, as the tables were before partitioning) and the VACUUM
    that must follow a DELETE before the space is used again. Both start after a
    checkpoint, as on a live server the rows pruned were written two days before."""
    raw_from = now - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS)
    day_start = partitions.period_start(raw_from, 24) + timedelta(days=1)
    day_end = day_start + timedelta(days=1)
    rows = 0
    for series in partitions.raw_series():
        plain = f"{series.table}_plain"
        sql(f'CREATE TABLE "{plain}" (LIKE "{series.table}" INCLUDING ALL)')
        sql(f'INSERT INTO "{plain}" SELECT * FROM "{series.table}"')  # noqa: S608
        sql(f'VACUUM ANALYZE "{plain}"')
        # the partial day before it goes first, unmeasured: then exactly one day is left
        # before day_end
        partitions.partitions_drop_before([(series, day_start)])
        rows += sql(
            f'SELECT 1 FROM "{series.table}" WHERE taken_at >= %s AND taken_at < %s',  # noqa: S608
            [day_start, day_end],
        )
    sql("CHECKPOINT")
    wal, began = _wal_lsn(), time.perf_counter()
    with transaction.atomic():
        for series in partitions.raw_series():
            sql(
                f'DELETE FROM "{series.table}_plain" WHERE taken_at >= %s AND taken_at < %s',  # noqa: S608
                [day_start, day_end],
            )
    deleted_s, deleted_wal = time.perf_counter() - began, _wal_lsn() - wal
    began = time.perf_counter()
    for series in partitions.raw_series():
        sql(f'VACUUM "{series.table}_plain"')
    vacuum_s = time.perf_counter() - began
    sql("CHECKPOINT")
    wal, began = _wal_lsn(), time.perf_counter()
    partitions.partitions_drop_before([(series, day_end) for series in partitions.raw_series()])
    dropped_s, dropped_wal = time.perf_counter() - began, _wal_lsn() - wal
    for series in partitions.raw_series():
        sql(f'DROP TABLE "{series.table}_plain"')
    return Prune(rows, dropped_s, deleted_s, vacuum_s, dropped_wal, deleted_wal)


def rollup_before(*, since: datetime, until: datetime) -> int:
    """The rollup as the platform computed it before: aggregated by the ORM, every row
    built in Python, upserted in batches."""
    rows = (
        GpuSample.objects.filter(taken_at__gte=since, taken_at__lt=until)
        .annotate(bucket=FiveMinuteBucket("taken_at"))
        .values("gpu_id", "bucket")
        .annotate(
            n=Count("id"),
            total=Max("memory_total_mb"),
            used_max=Max("memory_used_mb"),
            used_mean=Avg("memory_used_mb"),
            util_max=Max("utilization_gpu"),
            util_mean=Avg("utilization_gpu"),
        )
        .order_by()
    )
    rollups = [
        GpuSampleRollup(
            gpu_id=r["gpu_id"],
            bucket_start=r["bucket"],
            samples=r["n"],
            memory_total_mb=r["total"],
            memory_used_max_mb=r["used_max"],
            memory_used_mean_mb=float(r["used_mean"]),
            utilization_gpu_max=r["util_max"],
            utilization_gpu_mean=float(r["util_mean"]) if r["util_mean"] is not None else None,
        )
        for r in rows.iterator(chunk_size=5000)
    ]
    with transaction.atomic():
        GpuSampleRollup.objects.bulk_create(
            rollups,
            batch_size=2000,
            update_conflicts=True,
            unique_fields=["gpu", "bucket_start"],
            update_fields=[
                "samples",
                "memory_total_mb",
                "memory_used_max_mb",
                "memory_used_mean_mb",
                "utilization_gpu_max",
                "utilization_gpu_mean",
            ],
        )
    return len(rollups)


class FiveMinuteBucket(Func):
    """date_bin to five minutes, as the platform's ORM rollup used it."""

    template = "date_bin('5 minutes', %(expressions)s, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
    output_field = DateTimeField()


def advisor_before(*, gpu_ids: list[int], now: datetime) -> dict[int, dict]:
    """The advisor's window as it was read before: from the five-minute rollups."""
    rows = (
        GpuSampleRollup.objects.filter(gpu_id__in=gpu_ids, bucket_start__gte=now - MONTH)
        .values("gpu_id")
        .annotate(
            first=Min("bucket_start"),
            peak=Max("memory_used_max_mb"),
            days=Count(TruncDate("bucket_start"), distinct=True),
        )
        .order_by()
    )
    return {row["gpu_id"]: row for row in rows}


def _timed(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _python_peak(fn) -> float:
    """The most memory Python held while `fn` ran, in MiB."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", type=int, default=1, help="processes per GPU")
    parser.add_argument("--rounds", type=int, default=15, help="fleet samples for ingest")
    args = parser.parse_args()
    began = time.perf_counter()

    with throwaway_database("telemetry_scale"):
        if connection.vendor != "postgresql":
            raise SystemExit("telemetry_scale measures PostgreSQL: set DATABASE_URL")
        seed_fleet(nodes=args.nodes, gpus_per_node=args.gpus)
        gpus = Gpu.objects.count()
        now = datetime.now(UTC)
        partitions.partitions_ensure(start=now - timedelta(hours=1), end=now + timedelta(days=1))
        ingest_rate(rounds=1, procs=args.procs)  # warm-up: connections, caches, hooks
        empty_rate = ingest_rate(rounds=args.rounds, procs=args.procs)

        t = time.perf_counter()
        generate_history(now=now, procs=args.procs)
        raw = GpuSample.objects.count()
        print(
            f"fleet: {args.nodes} nodes, {gpus} GPUs; "
            f"generated in {time.perf_counter() - t:.0f} s: "
            f"{raw:,} raw GPU rows, {GpuSampleRollup.objects.count():,} rollups"
        )
        loaded_rate = ingest_rate(rounds=args.rounds, procs=args.procs)

        # one hour of the fleet's raw rows, rolled up: the database vs the old way
        hour = partitions.period_start(now - timedelta(hours=3), 1)
        new_s = _timed(
            lambda: retention.samples_rollup_window(since=hour, until=hour + timedelta(hours=1))
        )
        old_s = _timed(lambda: rollup_before(since=hour, until=hour + timedelta(hours=1)))
        new_mib = _python_peak(
            lambda: retention.samples_rollup_window(since=hour, until=hour + timedelta(hours=1))
        )
        old_mib = _python_peak(lambda: rollup_before(since=hour, until=hour + timedelta(hours=1)))

        ids = list(Gpu.objects.values_list("pk", flat=True))
        advisor_s = _timed(lambda: selectors.rollup_windows(gpu_ids=ids, now=now))
        advisor_old_s = _timed(lambda: advisor_before(gpu_ids=ids, now=now), repeat=1)
        new_answer = selectors.rollup_windows(gpu_ids=ids, now=now)
        assert len(new_answer) == len(ids), "every GPU has a month of history"

        before = _sizes("before pruning")
        prune = prune_one_day(now=now)
        after = _sizes("after pruning one day")
        freed = sum(before.values()) - sum(after.values())
        print(
            f"pruned {prune.rows:,} raw rows ({freed / 2**20:,.0f} MiB freed); "
            f"WAL written: drop {prune.dropped_wal / 2**20:,.1f} MiB, "
            f"DELETE {prune.deleted_wal / 2**20:,.0f} MiB"
        )

    print(f"run took {time.perf_counter() - began:.0f} s")
    print(
        f"RESULT ingest_rows_per_s={loaded_rate:,.0f} rows/s "
        f"baseline={empty_rate:,.0f} ratio={loaded_rate / empty_rate:.2f}"
    )
    ratio = prune.deleted_s / prune.dropped_s
    print(
        f"RESULT prune_one_day_s={prune.dropped_s:.3f} s baseline={prune.deleted_s:.2f} "
        f"ratio={ratio:.0f}"
    )
    print(f"RESULT prune_ratio={ratio:.0f}")
    reclaim = prune.deleted_s + prune.vacuum_s
    print(
        f"RESULT prune_reclaim_s={prune.dropped_s:.3f} s baseline={reclaim:.2f} "
        f"ratio={reclaim / prune.dropped_s:.0f}"
    )
    print(
        f"RESULT prune_wal_mib={prune.dropped_wal / 2**20:.2f} MiB "
        f"baseline={prune.deleted_wal / 2**20:.0f} "
        f"ratio={prune.deleted_wal / max(prune.dropped_wal, 1):.0f}"
    )
    print(f"RESULT rollup_one_hour_s={new_s:.2f} s baseline={old_s:.2f} ratio={old_s / new_s:.1f}")
    print(
        f"RESULT rollup_one_hour_python_mib={new_mib:.2f} MiB baseline={old_mib:.1f} "
        f"ratio={old_mib / max(new_mib, 0.01):.0f}"
    )
    print(
        f"RESULT advisor_30d_s={advisor_s:.3f} s baseline={advisor_old_s:.2f} "
        f"ratio={advisor_old_s / advisor_s:.0f}"
    )


if __name__ == "__main__":
    main()
