"""Reading nodes over SSH (the sampler, nvidia-smi where NVML is not usable, failure
counts) and storing their samples in bulk (rollups and retention: `retention`)."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from gpuplatform.dispatch import enqueue

from .. import smi, ssh, telemetry
from ..hooks import GpuSampleRow, ProcessSampleRow, SampleBatch, run_sample_hooks
from ..locks import node_lock, sampling_claim
from ..models import Allocation, Gpu, GpuSample, Node, ProcessSample
from .rejudge import nodes_gate_reset_after_absence

logger = logging.getLogger(__name__)


# --- talking to the node -------------------------------------------------------------------


# Nodes whose sampler said NVML is unavailable: nvidia-smi until this monotonic time.
_NO_NVML_UNTIL: dict[tuple, float] = {}
NO_NVML_RETRY_S = 300.0


def nodes_read(
    *, pool: ssh.SSHPool, endpoints: list[ssh.Endpoint], discover: bool
) -> list[telemetry.NodeSample | Exception]:
    """One reading per node, in order (an exception in a node's place when it failed).

    Requests go to each node's running sampler together (pipelined); a node whose NVML
    is unusable is read with nvidia-smi, one exec round trip per query."""
    request = telemetry.SERVE_REQUEST_DISCOVER if discover else telemetry.SERVE_REQUEST_SAMPLE
    now = time.monotonic()
    out: list[telemetry.NodeSample | Exception | None] = [None] * len(endpoints)
    streamed = [i for i, e in enumerate(endpoints) if _NO_NVML_UNTIL.get(e.key, 0.0) < now]
    answers = (
        pool.request_many(
            [
                (
                    endpoints[i],
                    telemetry.sampler_serve_argv(),
                    telemetry.sampler_serve_preamble(),
                    request,
                )
                for i in streamed
            ]
        )
        if streamed
        else []
    )
    for i, answer in zip(streamed, answers, strict=True):
        if isinstance(answer, ssh.SSHError):
            out[i] = answer
            continue
        try:
            out[i] = telemetry.parse_sampler_output(answer.decode("utf-8", errors="replace"))
        except telemetry.SamplerUnavailable:
            _NO_NVML_UNTIL[endpoints[i].key] = time.monotonic() + NO_NVML_RETRY_S
        except telemetry.ParseError as exc:
            out[i] = exc
    readings: list[telemetry.NodeSample | Exception] = []
    for endpoint, reading in zip(endpoints, out, strict=True):
        if reading is None:
            try:
                reading = _read_nvidia_smi(pool, endpoint)
            except (ssh.SSHError, telemetry.ParseError) as exc:
                reading = exc
        readings.append(reading)
    return readings


def _read_nvidia_smi(pool: ssh.SSHPool, endpoint: ssh.Endpoint) -> telemetry.NodeSample:
    gpus = pool.run(endpoint, smi.gpu_query_argv())
    if gpus.exit_status != 0:
        raise telemetry.ParseError(
            "neither NVML nor nvidia-smi answered: "
            f"{gpus.stderr.decode(errors='replace').strip()[:200]}"
        )
    apps = pool.run(endpoint, smi.app_query_argv())
    return smi.parse_nvidia_smi(
        gpus.stdout.decode(errors="replace"),
        apps.stdout.decode(errors="replace") if apps.exit_status == 0 else "",
        taken_at=timezone.now(),
    )


def node_record_failure(*, node: Node, exc: Exception) -> None:
    """Count a failed contact; at the threshold (or at once for a changed key) the node is
    unreachable, with the reason."""
    now = timezone.now()
    message = str(exc)[:500] or exc.__class__.__name__
    with transaction.atomic():
        locked = node_lock(node.pk)
        # capped: a node down for weeks must not overflow the counter
        locked.consecutive_failures = min(locked.consecutive_failures + 1, 32767)
        locked.last_error, locked.last_error_at = message, now
        fields = ["consecutive_failures", "last_error", "last_error_at"]
        give_up = isinstance(exc, ssh.HostKeyMismatch) or (
            locked.consecutive_failures >= settings.NODES_UNREACHABLE_AFTER
            and locked.status != Node.Status.PENDING
        )
        if give_up and locked.status != Node.Status.UNREACHABLE:
            locked.status = Node.Status.UNREACHABLE
            locked.status_reason = message
            fields += ["status", "status_reason"]
        locked.save(update_fields=fields)


def node_note_error(*, node_id: int, message: str) -> None:
    Node.objects.filter(pk=node_id).update(last_error=message[:500], last_error_at=timezone.now())


# --- sampling and ingest --------------------------------------------------------------------


PIPELINE_CHUNK = 100
Reading = tuple[Node, telemetry.NodeSample]  # a node and what it answered
Failure = tuple[Node, Exception]  # a node and why it did not answer


def nodes_sample(*, node_ids: list[int], pool: ssh.SSHPool | None = None) -> dict[str, int]:
    """Sample several nodes at once.

    Requests to every node's running sampler go out together (pipelined, so the nodes
    answer in parallel), in chunks; while one chunk's rows are written (one bulk write
    per table, on a second thread and database connection) the next chunk is read.
    Inside a caller's transaction everything runs inline, so its writes stay in it."""
    pool = pool or ssh.get_pool()
    nodes = list(Node.objects.filter(pk__in=node_ids).exclude(host_key=""))
    totals = {"nodes": len(nodes), "sampled": 0, "failed": 0, "gpu_rows": 0, "process_rows": 0}
    if not nodes:
        return totals
    chunks = [nodes[i : i + PIPELINE_CHUNK] for i in range(0, len(nodes), PIPELINE_CHUNK)]
    if connection.in_atomic_block or len(chunks) == 1:
        for chunk in chunks:
            _add(totals, _store_chunk(*_read_chunk(pool, chunk)))
        return totals

    def store(results: list[Reading], failures: list[Failure]) -> dict[str, int]:
        try:
            return _store_chunk(results, failures)
        finally:
            connection.close()  # this thread's own connection

    with ThreadPoolExecutor(max_workers=1) as writer:
        pending = [writer.submit(store, *_read_chunk(pool, chunk)) for chunk in chunks]
        for future in pending:
            _add(totals, future.result())
    return totals


def nodes_sample_once(*, node_ids: list[int], cycle_started: datetime) -> dict[str, int]:
    """One batch of a fan-out, each node sampled at most once per cycle whatever the
    broker delivers: a batch redelivered after its worker died (late acks), a late batch
    of the cycle before, a second beat's fan-out by mistake. A node another task is
    sampling now is left to it (`sampling_claim`), and one whose GPUs were sampled less
    than half an interval before this cycle began is not sampled again (their last sample
    is committed with the rows, under the claim)."""
    since = cycle_started - timedelta(seconds=settings.NODES_SAMPLE_INTERVAL / 2)
    with sampling_claim(node_ids) as claimed:
        done = set(
            Gpu.objects.filter(node_id__in=claimed, last_sample_at__gte=since).values_list(
                "node_id", flat=True
            )
        )
        todo = [node_id for node_id in claimed if node_id not in done]
        totals = nodes_sample(node_ids=todo)
    totals["skipped"] = len(node_ids) - len(todo)
    if totals["skipped"]:
        # every cycle: a second beat; now and then: a redelivery or a late batch
        logger.warning(
            "%d of %d nodes not sampled again this cycle (sampled already, or by another "
            "task now), first ids %s",
            totals["skipped"],
            len(node_ids),
            sorted(set(node_ids) - set(todo))[:10],
        )
    return totals


def _add(totals: dict[str, int], part: dict[str, int]) -> None:
    for key, value in part.items():
        totals[key] += value


def _read_chunk(pool: ssh.SSHPool, nodes: list[Node]) -> tuple[list[Reading], list[Failure]]:
    results: list[Reading] = []
    failures: list[Failure] = []
    readings = nodes_read(pool=pool, endpoints=[ssh.endpoint_for(n) for n in nodes], discover=False)
    for node, reading in zip(nodes, readings, strict=True):
        if isinstance(reading, Exception):
            if isinstance(reading, ssh.HostKeyMismatch):
                pool.drop(ssh.endpoint_for(node))
            failures.append((node, reading))
        else:
            results.append((node, reading))
    return results, failures


def _store_chunk(results: list[Reading], failures: list[Failure]) -> dict[str, int]:
    # The answers first: one node's bookkeeping problem must not cost the others' samples.
    batch = samples_ingest(results=results) if results else SampleBatch([], {})
    for node, exc in failures:
        try:
            node_record_failure(node=node, exc=exc)
        except Exception:
            logger.exception("could not record the failure of node %s", node.pk)
    return {
        "nodes": 0,
        "sampled": len(results),
        "failed": len(failures),
        "gpu_rows": len(batch.gpu_samples),
        "process_rows": len(batch.process_samples),
    }


def samples_ingest(*, results: list[Reading], received_at: datetime | None = None) -> SampleBatch:
    """Store a batch of readings: bulk inserts, the GPUs' latest values, node health.

    Rows are plain tuples, not model instances: building thousands of model objects
    per batch would cost more than writing them."""
    # The node's clock may drift; the platform's receive time orders the series.
    now = received_at or timezone.now()
    gpus = _gpus_by_uuid([n.pk for n, _ in results])
    gpu_rows, rediscover = _gpu_rows(results, gpus, now)
    proc_rows = _process_rows(results, gpus, now)
    held, by_container = _process_sums(proc_rows)
    books = {q.container_id: q.used_mb for _, sample in results for q in (sample.quota_usage or ())}
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            _commit_without_waiting_for_the_wal()
        # The nodes' rows first (nodes.locks' order: a discovery locks the node, then its
        # GPUs, which the sample rows reference).
        _nodes_answered(results, now)
        _insert_rows(GpuSample, gpu_rows)
        _insert_rows(ProcessSample, proc_rows)
        # Then allocations before GPUs, as allocation_release takes them.
        _count_allocations(gpu_rows, by_container, books, now)
        _update_latest(gpu_rows, held)
        for node_id in rediscover:
            enqueue("telemetry.discover_node", node_id)
    batch = SampleBatch(
        nodes=[n for n, _ in results],
        samples={n.pk: s for n, s in results},
        gpu_samples=gpu_rows,
        process_samples=proc_rows,
        gpu_uuids={
            gpu_id: uuid for uuid, (gpu_id, _) in gpus.items() if not uuid.startswith("MIG-")
        },
        quota_usage=books,
    )
    run_sample_hooks(batch)
    return batch


def _gpus_by_uuid(node_ids: list[int]) -> dict[str, tuple[int, int]]:
    """uuid (GPU or MIG device) -> (gpu id, node id) for the nodes' present GPUs."""
    gpus: dict[str, tuple[int, int]] = {}
    present = Gpu.objects.filter(node_id__in=node_ids, present=True)
    for gpu_id, uuid, node_id in present.values_list("id", "uuid", "node_id"):
        gpus[uuid] = (gpu_id, node_id)
    # MIG device UUIDs map to their GPU (only MIG GPUs carry a device list to decode).
    for gpu_id, node_id, mig_devices in present.filter(mig_enabled=True).values_list(
        "id", "node_id", "mig_devices"
    ):
        for mig in mig_devices or []:
            if mig.get("uuid"):
                gpus.setdefault(mig["uuid"], (gpu_id, node_id))
    return gpus


def _gpu_rows(
    results: list[Reading], gpus: dict[str, tuple[int, int]], now: datetime
) -> tuple[list[GpuSampleRow], set[int]]:
    """The GPU sample rows, and the nodes to discover again: those that report a GPU the
    platform does not know on them."""
    rows: list[GpuSampleRow] = []
    rediscover: set[int] = set()
    for node, sample in results:
        for r in sample.gpus:
            found = gpus.get(r.uuid)
            if found is None or found[1] != node.pk:
                rediscover.add(node.pk)
                continue
            rows.append(
                GpuSampleRow(
                    found[0],
                    now,
                    min(r.memory_used_mb, r.memory_total_mb),
                    r.memory_total_mb,
                    r.utilization_gpu,
                    r.utilization_memory,
                    r.temperature_c,
                    r.power_w,
                )
            )
    return rows, rediscover


def _process_rows(
    results: list[Reading], gpus: dict[str, tuple[int, int]], now: datetime
) -> list[ProcessSampleRow]:
    """The process sample rows of the GPUs the platform knows on each node."""
    rows: list[ProcessSampleRow] = []
    for node, sample in results:
        for p in sample.processes:
            found = gpus.get(p.gpu_uuid)
            if found is None or found[1] != node.pk:
                continue
            rows.append(
                ProcessSampleRow(
                    found[0],
                    now,
                    p.pid,
                    p.used_memory_mb,
                    p.container_id or "",
                    p.sm_utilization,
                    p.memory_utilization,
                )
            )
    return rows


def _process_sums(rows: list[ProcessSampleRow]) -> tuple[dict[int, int], dict[str, int]]:
    """MiB the processes hold per GPU id, and per container."""
    held: dict[int, int] = defaultdict(int)
    by_container: dict[str, int] = defaultdict(int)
    for p in rows:
        held[p.gpu_id] += p.used_memory_mb
        if p.container_id:
            by_container[p.container_id] += p.used_memory_mb
    return held, by_container


def _commit_without_waiting_for_the_wal() -> None:
    """Telemetry is periodic: losing the last fraction of a second of samples in a
    database crash is acceptable, waiting for the WAL flush on every batch is not. Scoped
    to the current transaction; everything else stays durable."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit TO OFF")


def _nodes_answered(results: list[Reading], now: datetime) -> None:
    """One UPDATE per telemetry source (almost always one): the node answered, so it is
    seen, its failure count resets, and an unreachable node recovers by itself (to
    draining if ops drained it meanwhile)."""
    recovered = Q(status=Node.Status.UNREACHABLE)
    # one away too long may be another machine now: judged again before it is sold
    # (the rows as read before the request say which were away: no query otherwise)
    away = [n.pk for n, _ in results if n.status == Node.Status.UNREACHABLE]
    if away:
        nodes_gate_reset_after_absence(node_ids=away, now=now)
    sources: dict[str, list[int]] = {}
    for node, sample in results:
        sources.setdefault(sample.source, []).append(node.pk)
    for source, ids in sources.items():
        Node.objects.filter(pk__in=ids).update(
            last_seen_at=now,
            consecutive_failures=0,
            last_error="",
            sample_source=source,
            status=Case(
                When(recovered & Q(drained_at__isnull=True), then=Value("active")),
                When(recovered, then=Value("draining")),
                default=F("status"),
            ),
            status_reason=Case(When(recovered, then=Value("")), default=F("status_reason")),
        )


_Series = TypeVar("_Series", GpuSample, ProcessSample)  # a time-series table
LATEST_FIELDS = [
    "last_memory_used_mb",
    "last_utilization_gpu",
    "last_utilization_memory",
    "last_temperature_c",
    "last_power_w",
    "last_processes_mb",
    "last_sample_at",
]


def _insert_rows(model: type[_Series], rows: Sequence[GpuSampleRow | ProcessSampleRow]) -> None:
    """Insert time-series rows (named tuples whose fields are the columns): COPY on
    PostgreSQL, an order of magnitude cheaper than INSERT; bulk_create elsewhere."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create([model(**row._asdict()) for row in rows], batch_size=2000)
        return
    statement = f"COPY {model._meta.db_table} ({', '.join(rows[0]._fields)}) FROM STDIN"
    with connection.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)


def _update_latest(rows: list[GpuSampleRow], held: dict[int, int]) -> None:
    """Keep each GPU's latest reading on its row (and what its processes hold). On
    PostgreSQL one UPDATE ... FROM unnest(arrays): Django's bulk_update builds a CASE per
    field and row, which costs more than the inserts it accompanies."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        gpus = [
            Gpu(
                pk=r.gpu_id,
                last_memory_used_mb=r.memory_used_mb,
                last_utilization_gpu=r.utilization_gpu,
                last_utilization_memory=r.utilization_memory,
                last_temperature_c=r.temperature_c,
                last_power_w=r.power_w,
                last_processes_mb=held.get(r.gpu_id, 0),
                last_sample_at=r.taken_at,
            )
            for r in rows
        ]
        Gpu.objects.bulk_update(gpus, LATEST_FIELDS, batch_size=500)
        return
    columns = [
        ("gpu_id", "id", "bigint"),
        ("memory_used_mb", "last_memory_used_mb", "integer"),
        ("utilization_gpu", "last_utilization_gpu", "smallint"),
        ("utilization_memory", "last_utilization_memory", "smallint"),
        ("temperature_c", "last_temperature_c", "smallint"),
        ("power_w", "last_power_w", "double precision"),
    ]
    arrays = [[getattr(r, attr) for r in rows] for attr, _, _ in columns]
    arrays.append([held.get(r.gpu_id, 0) for r in rows])
    types = [sql_type for _, _, sql_type in columns] + ["integer"]
    names = [name for _, name, _ in columns] + ["last_processes_mb"]
    unnest = ", ".join(f"%s::{sql_type}[]" for sql_type in types)
    assignments = ", ".join(f"{name} = v.{name}" for name in names[1:])
    # One batch shares its receive time: a scalar, not an array of timestamps.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Gpu._meta.db_table} AS g SET {assignments}, last_sample_at = %s "  # noqa: S608
            f"FROM unnest({unnest}) AS v({', '.join(names)}) WHERE g.id = v.id",
            [rows[0].taken_at, *arrays],
        )


def _count_allocations(
    rows: list[GpuSampleRow], by_container: dict[str, int], books: dict[str, int], now: datetime
) -> None:
    """Both counts on each live allocation of the sampled GPUs: NVML's (its container's
    processes; 0 when none ran) and the quota library's (where the node keeps books)."""
    gpu_ids = [r.gpu_id for r in rows]
    live = list(
        Allocation.objects.filter(gpu_id__in=gpu_ids, state=Allocation.State.ACTIVE)
        .exclude(container_id="")
        .order_by("pk")
        .values_list("pk", "container_id")
    )
    if not live:
        return
    ids = [pk for pk, _ in live]
    nvml = [by_container.get(cid, 0) for _, cid in live]
    library = [books.get(cid) for _, cid in live]
    if connection.vendor != "postgresql":
        Allocation.objects.bulk_update(
            [
                Allocation(pk=pk, nvml_mb=n, library_mb=lib, counted_at=now)
                for pk, n, lib in zip(ids, nvml, library, strict=True)
            ],
            ["nvml_mb", "library_mb", "counted_at"],
        )
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Allocation._meta.db_table} AS a SET nvml_mb = v.n, library_mb = v.l, "  # noqa: S608
            "counted_at = %s FROM unnest(%s::bigint[], %s::integer[], %s::integer[]) "
            "AS v(id, n, l) WHERE a.id = v.id",
            [now, ids, nvml, library],
        )
