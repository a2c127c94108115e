"""Telemetry storage on PostgreSQL: time partitions made ahead and dropped whole, rollups
computed in the database in bounded windows, day rollups for the advisor, and the
migration that moves existing rows into partitions."""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from nodes import partitions, selectors, services
from nodes.models import (
    Gpu,
    GpuDayRollup,
    GpuSample,
    GpuSampleRollup,
    Node,
    ProcessSample,
    RollupProgress,
)
from nodes.services import retention

pytestmark = pytest.mark.django_db

RAW, PROC = partitions.raw_series()
ROLLUPS = partitions.rollup_series()


@pytest.fixture
def gpu():
    node = Node.objects.create(gate_status="passed", name="ts", address="10.7.0.1")
    return Gpu.objects.create(node=node, uuid="GPU-ts-0", index=0, model="L4", vram_total_mb=23034)


def _holder(table: str, column: str, moment: datetime) -> str:
    """The partition a row of that time sits in (by the row, not by our bookkeeping)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT tableoid::regclass::text FROM "{table}" WHERE "{column}" = %s LIMIT 1',  # noqa: S608
            [moment],
        )
        row = cursor.fetchone()
    return row[0] if row else ""


def _exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


def _sample(gpu, at: datetime, used: int = 1000, util: int | None = 10) -> GpuSample:
    return GpuSample(
        gpu=gpu, taken_at=at, memory_used_mb=used, memory_total_mb=23034, utilization_gpu=util
    )


def test_the_time_series_tables_are_partitioned_with_a_default_partition():
    assert partitions.partitioned()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, p.partstrat FROM pg_partitioned_table p "
            "JOIN pg_class c ON c.oid = p.partrelid ORDER BY 1"
        )
        found = dict(cursor.fetchall())
    assert found == {
        "nodes_gpusample": "r",
        "nodes_gpusamplerollup": "r",
        "nodes_processsample": "r",
    }
    for series in partitions.all_series():
        assert _exists(series.default)
    # ordinary tables stay ordinary
    assert not partitions.partitions(partitions.Series("nodes_gpudayrollup", "day", 24))


def test_made_ahead_a_sample_lands_in_its_period_not_the_default(gpu):
    now = timezone.now()
    services.samples_rollup_and_prune(now=now)
    start = partitions.period_start(now, RAW.hours)
    parts = {p.lower: p for p in partitions.partitions(RAW)}
    # this period and the next ones exist, aligned to the period
    assert start in parts and start + RAW.width in parts
    assert parts[start].upper == start + RAW.width
    GpuSample.objects.bulk_create([_sample(gpu, now)])
    assert _holder(RAW.table, RAW.column, now) == parts[start].name
    # a second run makes nothing twice
    assert partitions.partitions_ensure(start=now, end=now + timedelta(hours=12)) == 0


def test_rows_held_by_the_default_partition_move_into_their_period_when_it_is_made(gpu):
    at = datetime(2020, 1, 1, 7, 30, tzinfo=UTC)  # no partition holds 2020
    GpuSample.objects.bulk_create([_sample(gpu, at), _sample(gpu, at + timedelta(hours=5))])
    assert _holder(RAW.table, RAW.column, at) == RAW.default
    made = partitions.partitions_ensure(start=at, end=at + timedelta(hours=1))
    assert made == 3  # this 6-hour period of both raw tables, and 2020-01-01 of the rollups
    assert _holder(RAW.table, RAW.column, at) == "nodes_gpusample_p202001010600"
    # the row past the new period stays in the default partition
    assert _holder(RAW.table, RAW.column, at + timedelta(hours=5)) == RAW.default
    assert GpuSample.objects.filter(gpu=gpu).count() == 2


def test_a_new_partition_starts_where_an_existing_one_ends_when_the_period_changed(settings):
    at = datetime(2021, 3, 1, 0, 0, tzinfo=UTC)
    partitions.partitions_ensure(start=at, end=at + timedelta(hours=1))  # 00-06
    settings.NODES_RAW_PARTITION_HOURS = 4
    series = partitions.raw_series()[0]
    partitions.partitions_ensure(start=at, end=at + timedelta(hours=9))
    spans = [(p.lower, p.upper) for p in partitions.partitions(series) if p.lower.year == 2021]
    hour = timedelta(hours=1)
    # 00-06 kept; then 06-08 to reach the 4-hour grid, then 08-12: no gap, no overlap
    assert spans == [
        (at, at + 6 * hour),
        (at + 6 * hour, at + 8 * hour),
        (at + 8 * hour, at + 12 * hour),
    ]


def test_retention_drops_whole_partitions_before_the_cutoff_and_keeps_the_straddling_one(
    gpu, settings
):
    now = datetime(2022, 6, 10, 13, 0, tzinfo=UTC)
    settings.NODES_RAW_RETENTION_HOURS = 48
    partitions.partitions_ensure(start=now - timedelta(days=4), end=now)
    old = now - timedelta(hours=60)  # 2022-06-08 01:00, period 00-06: wholly past
    straddling = now - timedelta(hours=47, minutes=30)  # period 12-18 of 06-08: not yet
    stray = datetime(2019, 5, 1, tzinfo=UTC)  # no period: the default partition
    GpuSample.objects.bulk_create(
        [_sample(gpu, old), _sample(gpu, straddling), _sample(gpu, stray), _sample(gpu, now)]
    )
    ProcessSample.objects.create(gpu=gpu, taken_at=old, pid=7, used_memory_mb=5)
    old_part = _holder(RAW.table, RAW.column, old)
    kept_part = _holder(RAW.table, RAW.column, straddling)
    RollupProgress.objects.create(
        series=retention.PROGRESS, rolled_through=old - timedelta(minutes=5)
    )
    result = services.samples_rollup_and_prune(now=now)
    assert not _exists(old_part)  # detached and dropped, not emptied
    assert _exists(kept_part)
    assert result["raw_partitions_dropped"] >= 1 and result["bytes_freed"] > 0
    assert result["raw_deleted"] == 1  # the stray, by DELETE from the default partition
    assert set(GpuSample.objects.values_list("taken_at", flat=True)) == {straddling, now}
    assert not ProcessSample.objects.exists()
    # every old row was rolled up before it went
    assert GpuSampleRollup.objects.filter(bucket_start=partitions.period_start(old, 1)).exists()


def test_raw_rows_not_yet_rolled_up_are_never_dropped(gpu, monkeypatch):
    now = datetime(2022, 7, 10, 13, 0, tzinfo=UTC)
    partitions.partitions_ensure(start=now - timedelta(days=4), end=now)
    old = now - timedelta(hours=60)
    GpuSample.objects.bulk_create([_sample(gpu, old)])
    # the rollups are far behind (a backlog): the budget lets no window run this time
    RollupProgress.objects.create(
        series=retention.PROGRESS, rolled_through=old - timedelta(hours=10)
    )
    with monkeypatch.context() as patch:
        patch.setattr(retention, "ROLLUP_BUDGET_S", 0.0)
        services.samples_rollup_and_prune(now=now)
    assert GpuSample.objects.filter(taken_at=old).exists()
    services.samples_rollup_and_prune(now=now)
    assert not GpuSample.objects.filter(taken_at=old).exists()
    assert GpuSampleRollup.objects.filter(gpu=gpu).exists()


def _python_rollups(rows: list[GpuSample]) -> dict:
    """The five-minute rollups computed the plain way, to hold the SQL against."""
    out: dict = {}
    for r in rows:
        start = r.taken_at - timedelta(seconds=r.taken_at.timestamp() % 300)
        out.setdefault((r.gpu_id, start), []).append(r)
    return {
        key: (
            len(rs),
            max(r.memory_used_mb for r in rs),
            sum(r.memory_used_mb for r in rs) / len(rs),
            max(r.utilization_gpu for r in rs if r.utilization_gpu is not None)
            if any(r.utilization_gpu is not None for r in rs)
            else None,
        )
        for key, rs in out.items()
    }


def test_rollups_computed_in_the_database_equal_the_samples_they_summarise(gpu):
    other = Gpu.objects.create(
        node=gpu.node, uuid="GPU-ts-1", index=1, model="L4", vram_total_mb=23034
    )
    rng = random.Random(7)
    start = datetime(2023, 1, 2, 10, 0, tzinfo=UTC)
    rows = [
        _sample(
            g,
            start + timedelta(seconds=rng.randrange(0, 3 * 3600)),
            used=rng.randrange(0, 23034),
            util=rng.choice([None, rng.randrange(0, 101)]),
        )
        for g in (gpu, other)
        for _ in range(400)
    ]
    GpuSample.objects.bulk_create(rows)
    # a run starts one bucket before where the last one stopped (rows committed late)
    RollupProgress.objects.create(
        series=retention.PROGRESS, rolled_through=start + retention.LATE_ROWS
    )
    run = retention.samples_rollup(until=start + timedelta(hours=3, minutes=2))
    assert run.windows == 3  # one bounded window per hour of raw rows
    assert run.rolled_through == start + timedelta(hours=3)
    expected = _python_rollups(rows)
    got = {
        (r.gpu_id, r.bucket_start): (
            r.samples,
            r.memory_used_max_mb,
            r.memory_used_mean_mb,
            r.utilization_gpu_max,
        )
        for r in GpuSampleRollup.objects.all()
    }
    assert got.keys() == expected.keys()
    for key, (n, peak, mean, util) in expected.items():
        assert got[key][:2] == (n, peak) and got[key][3] == util
        assert got[key][2] == pytest.approx(mean)
    # the days: one row per GPU, its peak the highest of its buckets
    days = {d.gpu_id: d for d in GpuDayRollup.objects.all()}
    for g in (gpu, other):
        mine = [r for r in rows if r.gpu_id == g.pk]
        assert days[g.pk].day == start.date()
        assert days[g.pk].memory_used_max_mb == max(r.memory_used_mb for r in mine)
    # rolling the same windows again changes nothing
    RollupProgress.objects.filter(series=retention.PROGRESS).update(
        rolled_through=start + retention.LATE_ROWS
    )
    retention.samples_rollup(until=start + timedelta(hours=3, minutes=2))
    again = {
        (r.gpu_id, r.bucket_start): (r.samples, r.memory_used_max_mb)
        for r in GpuSampleRollup.objects.all()
    }
    assert again == {k: v[:2] for k, v in got.items()}


def test_a_row_committed_after_its_bucket_was_rolled_is_counted_next_run(gpu):
    start = datetime(2023, 2, 1, 10, 0, tzinfo=UTC)
    GpuSample.objects.bulk_create([_sample(gpu, start + timedelta(minutes=1), used=100)])
    RollupProgress.objects.create(series=retention.PROGRESS, rolled_through=start)
    retention.samples_rollup(until=start + timedelta(minutes=5))
    # stamped before the run, committed after it
    GpuSample.objects.bulk_create([_sample(gpu, start + timedelta(minutes=4), used=900)])
    retention.samples_rollup(until=start + timedelta(minutes=10))
    rollup = GpuSampleRollup.objects.get(gpu=gpu, bucket_start=start)
    assert (rollup.samples, rollup.memory_used_max_mb) == (2, 900)
    assert GpuDayRollup.objects.get(gpu=gpu).memory_used_max_mb == 900


def test_a_run_that_dies_midway_keeps_the_windows_it_finished(gpu, monkeypatch):
    start = datetime(2023, 3, 1, 0, 0, tzinfo=UTC)
    GpuSample.objects.bulk_create(
        [_sample(gpu, start + timedelta(minutes=30 * i)) for i in range(6)]
    )
    RollupProgress.objects.create(
        series=retention.PROGRESS, rolled_through=start + retention.LATE_ROWS
    )
    real = retention.samples_rollup_window
    calls = []

    def dies_on_the_second(*, since, until):
        calls.append(since)
        if len(calls) == 2:
            raise RuntimeError("worker killed")
        return real(since=since, until=until)

    monkeypatch.setattr(retention, "samples_rollup_window", dies_on_the_second)
    with pytest.raises(RuntimeError):
        retention.samples_rollup(until=start + timedelta(hours=3))
    progress = RollupProgress.objects.get(series=retention.PROGRESS)
    assert progress.rolled_through == start + timedelta(hours=1)
    assert GpuSampleRollup.objects.filter(bucket_start__lt=start + timedelta(hours=1)).count() == 2
    assert not GpuSampleRollup.objects.filter(bucket_start__gte=start + timedelta(hours=1)).exists()


def test_day_rollups_keep_the_highest_peak_whatever_order_windows_fold_in(gpu):
    day = datetime(2023, 4, 5, tzinfo=UTC)
    for hour, peak in ((20, 5000), (3, 9000), (12, 100)):
        GpuSampleRollup.objects.create(
            gpu=gpu,
            bucket_start=day + timedelta(hours=hour),
            samples=1,
            memory_total_mb=23034,
            memory_used_max_mb=peak,
            memory_used_mean_mb=peak,
        )
        services.rollups_fold_days(
            since=day + timedelta(hours=hour), until=day + timedelta(hours=hour, minutes=5)
        )
    row = GpuDayRollup.objects.get(gpu=gpu)
    assert row.memory_used_max_mb == 9000
    assert row.first_bucket_start == day + timedelta(hours=3)
    assert row.last_bucket_start == day + timedelta(hours=20)


def test_the_advisor_reads_thirty_days_of_day_rollups(gpu):
    now = datetime(2023, 6, 30, 12, 0, tzinfo=UTC)
    GpuDayRollup.objects.bulk_create(
        GpuDayRollup(
            gpu=gpu,
            day=(now - timedelta(days=d)).date(),
            memory_total_mb=23034,
            memory_used_max_mb=40000 if d == 45 else 1000 + d,
            first_bucket_start=now - timedelta(days=d),
            last_bucket_start=now - timedelta(days=d),
        )
        for d in (0, 3, 10, 29, 45)
    )
    window = selectors.rollup_windows(gpu_ids=[gpu.pk], now=now)[gpu.pk]
    assert (window["days"], window["peak"]) == (4, 1029)
    assert window["first"] == now - timedelta(days=29)


def test_the_migration_moves_rows_into_partitions_and_back(gpu):
    migration = importlib.import_module("nodes.migrations.0015_partition_telemetry")
    now = timezone.now()
    rows = [_sample(gpu, now - timedelta(hours=h), used=h) for h in range(0, 40, 3)]
    GpuSample.objects.bulk_create(rows)
    before = sorted(GpuSample.objects.values_list("id", "taken_at", "memory_used_mb"))
    keep = timedelta(hours=54)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # as a migration's own transaction
        migration._rebuild(cursor, RAW.table, RAW.column, None, keep, now)  # plain again
        cursor.execute(
            "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = %s::regclass", [RAW.table]
        )
        assert cursor.fetchone()[0] == 0
        assert sorted(GpuSample.objects.values_list("id", "taken_at", "memory_used_mb")) == before
        migration._rebuild(cursor, RAW.table, RAW.column, 6, keep, now)
    assert sorted(GpuSample.objects.values_list("id", "taken_at", "memory_used_mb")) == before
    assert {p.lower for p in partitions.partitions(RAW)} >= {
        partitions.period_start(now - timedelta(hours=h), 6) for h in range(0, 40, 3)
    }
    assert _holder(RAW.table, RAW.column, rows[0].taken_at) != RAW.default
    # ids go on from where they were, and the constraints came along
    new = GpuSample.objects.create(gpu=gpu, taken_at=now, memory_used_mb=1, memory_total_mb=2)
    assert new.pk > max(pk for pk, _, _ in before)
    with pytest.raises(IntegrityError, match="used_within_total"), transaction.atomic():
        GpuSample.objects.create(gpu=gpu, taken_at=now, memory_used_mb=3, memory_total_mb=2)


SQLITE_SCRIPT = """
import json
from datetime import UTC, datetime, timedelta
from django.db import connection
from nodes import partitions, services
from nodes.models import Gpu, GpuDayRollup, GpuSample, GpuSampleRollup, Node, RollupProgress
gpu = Gpu.objects.create(
    node=Node.objects.create(name="sq", address="10.7.0.9", gate_status="passed"),
    uuid="GPU-sq", index=0, model="L4", vram_total_mb=23034,
)
def sample(at, used):
    return GpuSample(gpu=gpu, taken_at=at, memory_used_mb=used, memory_total_mb=23034)
now = datetime(2024, 1, 10, 12, 0, tzinfo=UTC)
start = now - timedelta(hours=60)
GpuSample.objects.bulk_create([sample(start + timedelta(minutes=1), 100)])
RollupProgress.objects.create(series="gpu_5min", rolled_through=start + timedelta(minutes=5))
services.samples_rollup(until=start + timedelta(minutes=5))
GpuSample.objects.bulk_create(
    [sample(start + timedelta(minutes=4), 900), sample(now - timedelta(minutes=1), 5)]
)
result = services.samples_rollup_and_prune(now=now)
bucket = GpuSampleRollup.objects.get(bucket_start=start)
print(json.dumps({
    "partitioned": partitions.partitioned(),
    "vendor": connection.vendor,
    "bucket": [bucket.samples, bucket.memory_used_max_mb],
    "day": GpuDayRollup.objects.get(day=start.date()).memory_used_max_mb,
    "raw_left": GpuSample.objects.count(),
    "raw_deleted": result["raw_deleted"],
}))
"""


def test_sqlite_keeps_plain_tables_rollups_in_sql_and_delete_pruning(tmp_path):
    """The embedded default of `make run`: the same rollups and retention, with DELETE."""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "REDIS_URL": ""}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, timeout=300)
    out = subprocess.run(
        [*manage, "shell", "-c", SQLITE_SCRIPT],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    ).stdout
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer == {
        "partitioned": False,
        "vendor": "sqlite",
        "bucket": [2, 900],  # the late row counted at the next run
        "day": 900,
        "raw_left": 1,  # rows past 48 h deleted once rolled up; the recent one kept
        "raw_deleted": 2,
    }
