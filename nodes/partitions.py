"""Time partitions of the telemetry tables: a PostgreSQL feature, and the one module that
knows it.

On PostgreSQL the raw samples (`nodes_gpusample`, `nodes_processsample`) and the
five-minute rollups (`nodes_gpusamplerollup`) are declared partitioned by RANGE on their
time column, one partition per period (raw: `NODES_RAW_PARTITION_HOURS`, rollups: a UTC
day). The periodic rollup task makes the next periods ahead of time, and retention
detaches and drops whole partitions: no DELETE, so no dead tuples, no vacuum debt and no
index bloat, whatever the fleet writes. Each table also has a DEFAULT partition, so a row
outside every period (a far-off clock, the task stalled, a test writing history) is kept
rather than refused; rows there move into their period when it is made, and retention
deletes what is left there past the cutoff.

Anywhere else (SQLite, the embedded default of `make run`) the tables are plain and
retention is DELETE; callers ask `partitioned()` and never look at the vendor themselves.

Retention by partition is whole periods: a raw row is kept at least the retention and at
most one period longer (TimescaleDB's `drop_chunks` and pg_partman behave the same way).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper

logger = logging.getLogger(__name__)

# How long partition maintenance waits for a table lock before giving up until its next
# run: DETACH takes an exclusive lock on the parent, and a statement queued behind a long
# report would hold up every sample insert queued behind it.
LOCK_TIMEOUT = "5s"
# Partitions are made this far ahead of now (at least two raw periods and tomorrow's
# rollups), so the insert path never waits for DDL.
MADE_AHEAD = timedelta(days=1)


@dataclass(frozen=True)
class Series:
    """A partitioned table: its name, the time column it is split on, the period."""

    table: str
    column: str
    hours: int

    @property
    def width(self) -> timedelta:
        return timedelta(hours=self.hours)

    @property
    def default(self) -> str:
        return f"{self.table}_default"


@dataclass(frozen=True)
class Partition:
    name: str
    lower: datetime
    upper: datetime


def raw_series() -> tuple[Series, Series]:
    hours = settings.NODES_RAW_PARTITION_HOURS
    return (
        Series("nodes_gpusample", "taken_at", hours),
        Series("nodes_processsample", "taken_at", hours),
    )


def rollup_series() -> Series:
    return Series("nodes_gpusamplerollup", "bucket_start", 24)


def all_series() -> tuple[Series, ...]:
    return (*raw_series(), rollup_series())


def partitioned() -> bool:
    """Whether the telemetry tables are partitioned here (PostgreSQL) or plain."""
    return connection.vendor == "postgresql"


def period_start(moment: datetime, hours: int) -> datetime:
    """The start of the period `moment` falls in: periods are aligned to the Unix epoch
    in UTC, so a 6-hour period starts at 00, 06, 12 or 18 h UTC."""
    step = hours * 3600
    return datetime.fromtimestamp(int(moment.timestamp()) // step * step, tz=UTC)


def _literal(moment: datetime) -> str:
    # Partition bounds are DDL, which takes no parameters; the value is ours, never input.
    return "'" + moment.astimezone(UTC).isoformat(sep=" ") + "'"


_BOUNDS = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")


def partitions(series: Series) -> list[Partition]:
    """The table's time partitions, oldest first (the DEFAULT partition is not one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [series.table],
        )
        rows = cursor.fetchall()
    out = []
    for name, bound in rows:
        found = _BOUNDS.search(bound or "")
        if found:  # not the DEFAULT partition
            lower, upper = (datetime.fromisoformat(v) for v in found.groups())
            out.append(Partition(name, lower, upper))
    return sorted(out, key=lambda p: p.lower)


def partitions_ensure(
    *, start: datetime, end: datetime, series: tuple[Series, ...] | None = None
) -> int:
    """Make the missing partitions that cover [start, end) in these series (all, for
    None); returns how many were made. Existing partitions are respected even if the
    period setting changed since they were made: a new one starts where the last ends."""
    if not partitioned():
        return 0
    return sum(_ensure(one, start=start, end=end) for one in series or all_series())


def _ensure(series: Series, *, start: datetime, end: datetime) -> int:
    existing = partitions(series)
    made = 0
    t = period_start(start, series.hours)
    while t < end:
        holder = next((p for p in existing if p.lower <= t < p.upper), None)
        if holder is not None:
            t = holder.upper
            continue
        upper = period_start(t, series.hours) + series.width
        later = [p.lower for p in existing if p.lower > t]
        upper = min([upper, *later])
        try:
            _create(series, t, upper)
        except OperationalError as exc:  # a lock not granted in time: next run
            logger.warning("could not make a partition of %s at %s: %s", series.table, t, exc)
            return made
        existing.append(Partition(_name(series, t), t, upper))
        made += 1
        t = upper
    return made


def _name(series: Series, lower: datetime) -> str:
    return f"{series.table}_p{lower.astimezone(UTC):%Y%m%d%H%M}"


def _ddl_preamble(cursor: CursorWrapper) -> None:
    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    # Foreign-key checks of rows written earlier in the same transaction (deferred, as
    # Django declares them) would forbid altering the table: run them now.
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def _create(series: Series, lower: datetime, upper: datetime) -> None:
    """Make one partition: a table like the parent, the rows the DEFAULT partition holds
    for its period moved in, then attached (ATTACH takes only a SHARE UPDATE EXCLUSIVE
    lock on the parent, so sampling and pages carry on meanwhile)."""
    name = _name(series, lower)
    with transaction.atomic(), connection.cursor() as cursor:
        _ddl_preamble(cursor)
        cursor.execute(
            f'CREATE TABLE "{name}" (LIKE "{series.table}" '
            "INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute(
            f'WITH moved AS (DELETE FROM "{series.default}" '  # noqa: S608 - our own names
            f'WHERE "{series.column}" >= %s AND "{series.column}" < %s RETURNING *) '
            f'INSERT INTO "{name}" SELECT * FROM moved',
            [lower, upper],
        )
        cursor.execute(
            f'ALTER TABLE "{series.table}" ATTACH PARTITION "{name}" '
            f"FOR VALUES FROM ({_literal(lower)}) TO ({_literal(upper)})"
        )


@dataclass
class Dropped:
    partitions: int = 0
    bytes: int = 0
    rows_deleted: int = 0


def partitions_drop_before(plan: list[tuple[Series, datetime]]) -> dict[str, Dropped]:
    """Retention: for each (table, cutoff) every row older than the cutoff goes. On
    PostgreSQL the partitions wholly before it are detached and dropped, all in one
    transaction (a commit that drops files always waits for its WAL flush: one wait for
    the run, not one per partition), a partition that straddles the cutoff stays until it
    is wholly past, and stray rows in the DEFAULT partition are deleted. Elsewhere, one
    DELETE per table. Keyed by table name."""
    out = {series.table: Dropped() for series, _ in plan}
    if not partitioned():
        with connection.cursor() as cursor:
            for series, cutoff in plan:
                cursor.execute(
                    f'DELETE FROM "{series.table}" WHERE "{series.column}" < %s',  # noqa: S608
                    # raw SQL: adapted as a field would be (SQLite compares stored text)
                    [connection.ops.adapt_datetimefield_value(cutoff)],
                )
                out[series.table].rows_deleted = cursor.rowcount
        return out
    due = [(series, p) for series, cutoff in plan for p in partitions(series) if p.upper <= cutoff]
    if due:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                _ddl_preamble(cursor)
                for series, part in due:
                    cursor.execute("SELECT pg_total_relation_size(%s::regclass)", [part.name])
                    out[series.table].bytes += cursor.fetchone()[0]
                    out[series.table].partitions += 1
                    cursor.execute(f'ALTER TABLE "{series.table}" DETACH PARTITION "{part.name}"')
                    cursor.execute(f'DROP TABLE "{part.name}"')
        except OperationalError as exc:  # a lock not granted in time: next run
            logger.warning("could not drop partitions past retention: %s", exc)
            out = {series.table: Dropped() for series, _ in plan}
    with connection.cursor() as cursor:
        for series, cutoff in plan:
            cursor.execute(
                f'DELETE FROM "{series.default}" WHERE "{series.column}" < %s',  # noqa: S608
                [cutoff],
            )
            out[series.table].rows_deleted = cursor.rowcount
    return out


def table_bytes(table: str) -> int:
    """The table's size on disk with its indexes (and all its partitions)."""
    if not partitioned():
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) "
            "FROM pg_partition_tree(%s::regclass)",
            [table],
        )
        return int(cursor.fetchone()[0])
