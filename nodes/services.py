"""Every write to nodes, GPUs and samples: registration, host-key approval, discovery,
sampling and ingest, drain, retention."""

from __future__ import annotations

import ipaddress
import logging
import re
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Avg, Case, Count, F, Max, Min, Q, Sum, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from gpuplatform.errors import Conflict, ServiceError

from . import ssh, telemetry
from .hooks import GpuSampleRow, ProcessSampleRow, SampleBatch, run_sample_hooks
from .models import Allocation, Gpu, GpuSample, GpuSampleRollup, Node, ProcessSample

logger = logging.getLogger(__name__)

HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
SSH_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


# --- validation -----------------------------------------------------------------------


def _clean_address(address: str) -> str:
    address = (address or "").strip()
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    if not HOSTNAME_RE.match(address):
        raise ServiceError(
            "Enter a host name or an IP address (letters, digits, dots and hyphens only).",
            code="invalid_address",
            field="address",
        )
    return address.lower()


def _clean_registration(*, name: str, address: str, port: int, ssh_user: str) -> dict:
    name = (name or "").strip()
    if not NAME_RE.match(name):
        raise ServiceError(
            "Use lower-case letters, digits and hyphens (up to 63), starting with a "
            "letter or digit.",
            code="invalid_name",
            field="name",
        )
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ServiceError(
            "The SSH port must be between 1 and 65535.", code="invalid_port", field="port"
        )
    if not SSH_USER_RE.match(ssh_user or ""):
        raise ServiceError(
            "Enter a POSIX user name (lower-case letters, digits, _ and -).",
            code="invalid_user",
            field="ssh_user",
        )
    return {"name": name, "address": _clean_address(address), "port": port, "ssh_user": ssh_user}


def _clean_host_key(host_key: str) -> str:
    try:
        return ssh.normalise_host_key(host_key)
    except ValueError as exc:
        raise ServiceError(
            f"Not a usable host key: {exc}.", code="invalid_host_key", field="host_key"
        ) from exc


def endpoint_for(node: Node) -> ssh.Endpoint:
    return ssh.Endpoint(node.address, node.port, node.ssh_user, node.host_key)


# --- registration and host keys ---------------------------------------------------------


@transaction.atomic
def node_register(
    *,
    name: str,
    address: str,
    port: int = 22,
    ssh_user: str = "gpuplatform",
    host_key: str = "",
) -> Node:
    """Register a node. With a host key (a known_hosts line ops vouch for) it is pinned
    and discovery starts; without one the node's key is read for ops to approve."""
    data = _clean_registration(name=name, address=address, port=port, ssh_user=ssh_user)
    node = Node(**data, status=Node.Status.PENDING)
    if host_key.strip():
        node.host_key = _clean_host_key(host_key)
        node.host_key_fingerprint = ssh.fingerprint(node.host_key)
    try:
        with transaction.atomic():
            node.save()
    except IntegrityError as exc:
        if Node.objects.filter(name=data["name"]).exists():
            raise Conflict(
                "A node with this name exists.", code="duplicate_name", field="name"
            ) from exc
        raise Conflict(
            "A node with this address and port is already registered.",
            code="duplicate_endpoint",
            field="address",
        ) from exc
    from . import tasks

    if node.host_key:
        tasks.discover_node.delay_on_commit(node.pk)
    else:
        tasks.scan_host_key.delay_on_commit(node.pk)
    return node


@transaction.atomic
def node_update(*, node: Node, **changes) -> Node:
    """Change where or how a node is reached. A new address drops the pinned key."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    data = _clean_registration(
        name=changes.get("name", node.name),
        address=changes.get("address", node.address),
        port=changes.get("port", node.port),
        ssh_user=changes.get("ssh_user", node.ssh_user),
    )
    moved = (data["address"], data["port"]) != (node.address, node.port)
    for key, value in data.items():
        setattr(node, key, value)
    if "host_key" in changes and changes["host_key"].strip():
        node.host_key = _clean_host_key(changes["host_key"])
        node.host_key_fingerprint = ssh.fingerprint(node.host_key)
        node.pending_host_key = ""
    elif moved:
        # Another machine answers at the new address: its key must be approved again.
        node.host_key = node.host_key_fingerprint = ""
        node.status = Node.Status.PENDING
        node.status_reason = "address changed: approve the new host key"
    try:
        with transaction.atomic():
            node.save()
    except IntegrityError as exc:
        raise Conflict(
            "Another node has this name or address and port.", code="duplicate", field="name"
        ) from exc
    from . import tasks

    if moved and not node.host_key:
        tasks.scan_host_key.delay_on_commit(node.pk)
    return node


def node_scan_host_key(*, node_id: int) -> Node | None:
    """Read the node's host key (nothing is sent) and keep it for ops to approve."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return None
    try:
        key = ssh.scan_host_key(node.address, node.port, settings.NODES_SSH_CONNECT_TIMEOUT)
    except ssh.SSHError as exc:
        Node.objects.filter(pk=node.pk).update(
            last_error=str(exc)[:500], last_error_at=timezone.now()
        )
        raise
    if key == node.host_key:
        return node
    Node.objects.filter(pk=node.pk).update(pending_host_key=key, last_error="")
    node.refresh_from_db()
    return node


@transaction.atomic
def node_approve_host_key(*, node: Node, fingerprint: str) -> Node:
    """Pin the key read from the node. The fingerprint ops saw must match what is pinned,
    so a key that changed between display and approval is never trusted."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    if not node.pending_host_key:
        raise Conflict(
            "There is no host key waiting for approval; rescan the node first.",
            code="nothing_pending",
            field="fingerprint",
        )
    expected = ssh.fingerprint(node.pending_host_key)
    if fingerprint.strip() != expected:
        raise ServiceError(
            f"The fingerprint does not match the key read from the node ({expected}).",
            code="fingerprint_mismatch",
            field="fingerprint",
        )
    node.host_key = node.pending_host_key
    node.host_key_fingerprint = expected
    node.pending_host_key = ""
    node.consecutive_failures = 0
    if node.status == Node.Status.UNREACHABLE:
        node.status = node.reachable_status
    node.status_reason = ""
    node.save()
    from . import tasks

    tasks.discover_node.delay_on_commit(node.pk)
    return node


@transaction.atomic
def node_rescan(*, node: Node) -> Node:
    from . import tasks

    tasks.scan_host_key.delay_on_commit(node.pk)
    return node


# --- drain --------------------------------------------------------------------------------


@transaction.atomic
def node_drain(*, node: Node, reason: str = "") -> Node:
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.drained_at is None:
        node.drained_at = timezone.now()
    node.drain_reason = reason.strip()[:500]
    if node.status == Node.Status.ACTIVE:
        node.status = Node.Status.DRAINING
    node.save(update_fields=["drained_at", "drain_reason", "status"])
    return node


@transaction.atomic
def node_undrain(*, node: Node) -> Node:
    node = Node.objects.select_for_update().get(pk=node.pk)
    node.drained_at = None
    node.drain_reason = ""
    if node.status == Node.Status.DRAINING:
        node.status = Node.Status.ACTIVE
    node.save(update_fields=["drained_at", "drain_reason", "status"])
    return node


# --- talking to the node -------------------------------------------------------------------


# Nodes whose sampler said NVML is unavailable: nvidia-smi until this monotonic time.
_NO_NVML_UNTIL: dict[tuple, float] = {}
NO_NVML_RETRY_S = 300.0


def _read_nodes(
    pool: ssh.SSHPool, endpoints: list[ssh.Endpoint], *, discover: bool
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
    for i, endpoint in enumerate(endpoints):
        if out[i] is None:
            try:
                out[i] = _read_nvidia_smi(pool, endpoint)
            except (ssh.SSHError, telemetry.ParseError) as exc:
                out[i] = exc
    return out  # type: ignore[return-value]


def _read_nvidia_smi(pool: ssh.SSHPool, endpoint: ssh.Endpoint) -> telemetry.NodeSample:
    gpus = pool.run(endpoint, telemetry.gpu_query_argv())
    if gpus.exit_status != 0:
        raise telemetry.ParseError(
            "neither NVML nor nvidia-smi answered: "
            f"{gpus.stderr.decode(errors='replace').strip()[:200]}"
        )
    apps = pool.run(endpoint, telemetry.app_query_argv())
    return telemetry.parse_nvidia_smi(
        gpus.stdout.decode(errors="replace"),
        apps.stdout.decode(errors="replace") if apps.exit_status == 0 else "",
        taken_at=timezone.now(),
    )


def _record_failure(node: Node, exc: Exception) -> None:
    """Count a failed contact; at the threshold (or at once for a changed key) the node is
    unreachable, with the reason."""
    now = timezone.now()
    message = str(exc)[:500] or exc.__class__.__name__
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
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


def node_discover(*, node_id: int, pool: ssh.SSHPool | None = None) -> Node | None:
    """Read the node's GPUs, driver and what it can enforce; update the inventory.

    A GPU that is no longer there is flagged (present=False), never deleted: samples,
    allocations and incidents still point at it."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None or not node.host_key:
        return node
    pool = pool or ssh.get_pool()
    [sample] = _read_nodes(pool, [endpoint_for(node)], discover=True)
    if isinstance(sample, Exception):
        _record_failure(node, sample)
        raise sample
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        seen = {reading.uuid for reading in sample.gpus}
        # First flag what vanished, so a replacement GPU can take its index.
        Gpu.objects.filter(node=node, present=True).exclude(uuid__in=seen).update(
            present=False,
            accepting_placements=False,
            not_accepting_reason="no longer found on the node",
        )
        # By UUID across the fleet: a GPU moved from another node keeps its history.
        existing = {g.uuid: g for g in Gpu.objects.filter(uuid__in=seen)}
        for reading in sample.gpus:
            gpu = existing.get(reading.uuid) or Gpu(node=node, uuid=reading.uuid)
            gpu.node = node
            gpu.index = reading.index
            gpu.model = reading.name
            gpu.vram_total_mb = reading.memory_total_mb
            gpu.mig_capable = reading.mig_capable
            gpu.mig_enabled = reading.mig_enabled
            gpu.pci_bus_id = reading.pci_bus_id or ""
            gpu.mig_devices = [
                {
                    "uuid": m.uuid,
                    "memory_total_mb": m.memory_total_mb,
                    "profile": m.profile,
                    "gi_id": m.gi_id,
                    "ci_id": m.ci_id,
                }
                for m in reading.mig_devices
            ]
            if gpu.mig_enabled:
                gpu.overcommit_ratio = 1  # MIG partitions and overcommit exclude each other
            gpu.present = True
            gpu.save()
        caps = sample.capabilities or telemetry.Capabilities()
        node.capabilities = {
            "docker": caps.docker,
            "nvidia_runtime": caps.nvidia_runtime,
            "mig": caps.mig or any(g.mig_capable for g in sample.gpus),
            "vram_quota_library": caps.vram_quota_library or "",
        }
        node.driver_version = sample.driver_version
        node.cuda_version = sample.cuda_version
        node.sample_source = sample.source
        node.discovered_at = node.last_seen_at = now
        node.consecutive_failures = 0
        node.last_error = ""
        if node.status in (Node.Status.PENDING, Node.Status.UNREACHABLE):
            node.status = node.reachable_status
            node.status_reason = ""
        node.save()
    return node


# --- sampling and ingest --------------------------------------------------------------------


def sampleable_nodes() -> models.QuerySet[Node]:
    return Node.objects.exclude(host_key="").exclude(status=Node.Status.PENDING)


PIPELINE_CHUNK = 100


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
    from concurrent.futures import ThreadPoolExecutor

    def store(results, failures):  # type: ignore[no-untyped-def]
        try:
            return _store_chunk(results, failures)
        finally:
            connection.close()  # this thread's own connection

    with ThreadPoolExecutor(max_workers=1) as writer:
        pending = [writer.submit(store, *_read_chunk(pool, chunk)) for chunk in chunks]
        for future in pending:
            _add(totals, future.result())
    return totals


def _add(totals: dict[str, int], part: dict[str, int]) -> None:
    for key, value in part.items():
        totals[key] += value


def _read_chunk(pool: ssh.SSHPool, nodes: list[Node]):  # type: ignore[no-untyped-def]
    results: list[tuple[Node, telemetry.NodeSample]] = []
    failures: list[tuple[Node, Exception]] = []
    readings = _read_nodes(pool, [endpoint_for(n) for n in nodes], discover=False)
    for node, reading in zip(nodes, readings, strict=True):
        if isinstance(reading, Exception):
            if isinstance(reading, ssh.HostKeyMismatch):
                pool.drop(endpoint_for(node))
            failures.append((node, reading))
        else:
            results.append((node, reading))
    return results, failures


def _store_chunk(results, failures) -> dict[str, int]:  # type: ignore[no-untyped-def]
    # The answers first: one node's bookkeeping problem must not cost the others' samples.
    batch = samples_ingest(results=results) if results else SampleBatch([], {})
    for node, exc in failures:
        try:
            _record_failure(node, exc)
        except Exception:
            logger.exception("could not record the failure of node %s", node.pk)
    return {
        "nodes": 0,
        "sampled": len(results),
        "failed": len(failures),
        "gpu_rows": len(batch.gpu_samples),
        "process_rows": len(batch.process_samples),
    }


def node_sample(*, node_id: int, pool: ssh.SSHPool | None = None) -> dict[str, int]:
    return nodes_sample(node_ids=[node_id], pool=pool)


def samples_ingest(
    *, results: list[tuple[Node, telemetry.NodeSample]], received_at: datetime | None = None
) -> SampleBatch:
    """Store a batch of readings: bulk inserts, the GPUs' latest values, node health.

    Rows are plain tuples, not model instances: building thousands of model objects
    per batch would cost more than writing them."""
    now = received_at or timezone.now()
    node_ids = [n.pk for n, _ in results]
    gpus: dict[str, tuple[int, int]] = {}  # uuid (GPU or MIG device) -> (gpu id, node id)
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
    gpu_rows: list[GpuSampleRow] = []
    proc_rows: list[ProcessSampleRow] = []
    rediscover: set[int] = set()
    for node, sample in results:
        # The node's clock may drift; the platform's receive time orders the series.
        for r in sample.gpus:
            found = gpus.get(r.uuid)
            if found is None or found[1] != node.pk:
                rediscover.add(node.pk)
                continue
            gpu_rows.append(
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
        for p in sample.processes:
            found = gpus.get(p.gpu_uuid)
            if found is None or found[1] != node.pk:
                continue
            proc_rows.append(
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
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            # Telemetry is periodic: losing the last fraction of a second of samples in a
            # database crash is acceptable, waiting for the WAL flush on every batch is
            # not. Scoped to this transaction; everything else stays durable.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        _insert_rows(GpuSample, gpu_rows)
        _insert_rows(ProcessSample, proc_rows)
        _update_latest(gpu_rows)
        # One UPDATE per telemetry source (almost always one): the node answered, so
        # it is seen, its failure count resets, and an unreachable node recovers by
        # itself (to draining if ops drained it meanwhile).
        recovered = Q(status=Node.Status.UNREACHABLE)
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
        if rediscover:
            from . import tasks

            for node_id in rediscover:
                tasks.discover_node.delay_on_commit(node_id)
    batch = SampleBatch(
        nodes=[n for n, _ in results],
        samples={n.pk: s for n, s in results},
        gpu_samples=gpu_rows,
        process_samples=proc_rows,
    )
    run_sample_hooks(batch)
    return batch


LATEST_FIELDS = [
    "last_memory_used_mb",
    "last_utilization_gpu",
    "last_utilization_memory",
    "last_temperature_c",
    "last_power_w",
    "last_sample_at",
]


def _insert_rows(model: type[models.Model], rows: list) -> None:
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


def _update_latest(rows: list[GpuSampleRow]) -> None:
    """Keep each GPU's latest reading on its row. On PostgreSQL one UPDATE ... FROM
    unnest(arrays): Django's bulk_update builds a CASE per field and row, which costs
    more than the inserts it accompanies."""
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
    unnest = ", ".join(f"%s::{sql_type}[]" for _, _, sql_type in columns)
    names = ", ".join(name for _, name, _ in columns)
    assignments = ", ".join(f"{name} = v.{name}" for _, name, _ in columns[1:])
    # One batch shares its receive time: a scalar, not an array of timestamps.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Gpu._meta.db_table} AS g SET {assignments}, last_sample_at = %s "  # noqa: S608
            f"FROM unnest({unnest}) AS v({names}) WHERE g.id = v.id",
            [rows[0].taken_at, *arrays],
        )


# --- placement ----------------------------------------------------------------------------


def _candidates(vram_mb: int) -> list:  # type: ignore[type-arg]
    """GPUs that may take a reservation now, with what is already allocated on them."""
    from .placement import Candidate, MigSlot

    live = ~Q(allocations__state=Allocation.State.RELEASED)
    gpus = (
        Gpu.objects.filter(
            present=True,
            accepting_placements=True,
            node__status=Node.Status.ACTIVE,
            node__drained_at__isnull=True,
        )
        .annotate(allocated=Coalesce(Sum("allocations__vram_mb", filter=live), 0))
        .order_by("pk")
    )
    taken_mig = set(
        Allocation.objects.exclude(state=Allocation.State.RELEASED)
        .exclude(mig_device_uuid="")
        .values_list("mig_device_uuid", flat=True)
    )
    return [
        Candidate(
            gpu_id=g.pk,
            total_mb=g.vram_total_mb,
            allocated_mb=g.allocated,
            overcommit_ratio=g.overcommit_ratio,
            mig_enabled=g.mig_enabled,
            free_mig=tuple(
                MigSlot(m["uuid"], m["memory_total_mb"])
                for m in (g.mig_devices or [])
                if m.get("uuid") and m["uuid"] not in taken_mig
            ),
        )
        for g in gpus
    ]


MAX_PLACEMENT_ATTEMPTS = 5


def allocation_reserve(*, owner_key: str, vram_mb: int) -> Allocation | None:
    """Reserve `vram_mb` for `owner_key` on the best GPU, or return None (no capacity).

    Optimistic and safe: the choice is made without locks, then the chosen GPU's row is
    locked and its allocations re-counted inside the transaction; if a concurrent
    reservation took the room, the next attempt chooses again. One GPU lock at a time
    (always a single row), so two reservations never deadlock, and capacity x ratio is
    never exceeded."""
    from .placement import choose

    if vram_mb <= 0:
        raise ServiceError("A reservation needs some VRAM.", field="vram_mb")
    for _ in range(MAX_PLACEMENT_ATTEMPTS):
        choice = choose(_candidates(vram_mb), vram_mb)
        if choice is None:
            return None
        with transaction.atomic():
            gpu = (
                Gpu.objects.select_for_update(of=("self",))
                .filter(
                    pk=choice.gpu_id,
                    present=True,
                    accepting_placements=True,
                    node__status=Node.Status.ACTIVE,
                    node__drained_at__isnull=True,
                )
                .first()
            )
            if gpu is None:
                continue
            allocated = (
                Allocation.objects.filter(gpu=gpu)
                .exclude(state=Allocation.State.RELEASED)
                .aggregate(total=Coalesce(Sum("vram_mb"), 0))["total"]
            )
            if choice.mig_device_uuid:
                taken = Allocation.objects.filter(mig_device_uuid=choice.mig_device_uuid).exclude(
                    state=Allocation.State.RELEASED
                )
                if taken.exists():
                    continue
            elif allocated + vram_mb > int(gpu.vram_total_mb * gpu.overcommit_ratio):
                continue
            try:
                with transaction.atomic():
                    return Allocation.objects.create(
                        gpu=gpu,
                        vram_mb=vram_mb,
                        owner_key=owner_key,
                        mig_device_uuid=choice.mig_device_uuid,
                    )
            except IntegrityError as exc:
                raise Conflict(
                    "This owner already holds VRAM.", code="already_allocated", field="owner_key"
                ) from exc
    return None


@transaction.atomic
def allocation_release(*, allocation: Allocation) -> Allocation:
    """Give the VRAM back. Safe to run twice."""
    allocation = Allocation.objects.select_for_update().get(pk=allocation.pk)
    if allocation.state != Allocation.State.RELEASED:
        allocation.state = Allocation.State.RELEASED
        allocation.released_at = timezone.now()
        allocation.save(update_fields=["state", "released_at"])
    return allocation


# --- retention -------------------------------------------------------------------------------


class FiveMinuteBucket(models.Func):
    """The start of the five-minute bucket a timestamp falls in (UTC)."""

    output_field = models.DateTimeField()

    def as_postgresql(self, compiler, connection, **extra):  # type: ignore[no-untyped-def]
        return self.as_sql(
            compiler,
            connection,
            template="date_bin('5 minutes', %(expressions)s, TIMESTAMPTZ '2000-01-01 00:00:00+00')",
            **extra,
        )

    def as_sqlite(self, compiler, connection, **extra):  # type: ignore[no-untyped-def]
        return self.as_sql(
            compiler,
            connection,
            template="datetime((CAST(strftime('%%s', %(expressions)s) AS INTEGER) / 300) * 300,"
            " 'unixepoch')",
            **extra,
        )


def samples_rollup_and_prune(*, now: datetime | None = None) -> dict[str, int]:
    """Fold raw samples into five-minute rollups (max and mean), then delete raw samples
    past their retention and rollups past theirs. Safe to run twice: rollups are
    recomputed from the raw rows and upserted."""
    now = now or timezone.now()
    raw_cutoff = now - timedelta(hours=settings.NODES_RAW_RETENTION_HOURS)
    rollup_cutoff = now - timedelta(days=settings.NODES_ROLLUP_RETENTION_DAYS)
    # Only complete buckets; start again from the last bucket already rolled up.
    complete_before = now - timedelta(seconds=now.timestamp() % 300)
    last = GpuSampleRollup.objects.aggregate(last=Max("bucket_start"))["last"]
    if last is None:  # first run: roll up everything there is before anything is pruned
        last = GpuSample.objects.aggregate(first=Min("taken_at"))["first"] or now
    since = last
    rows = (
        GpuSample.objects.filter(taken_at__gte=since, taken_at__lt=complete_before)
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
            bucket_start=_aware(r["bucket"]),
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
        # Raw rows are deleted only once their bucket is rolled up.
        pruned_raw, _ = GpuSample.objects.filter(
            taken_at__lt=min(raw_cutoff, complete_before)
        ).delete()
        pruned_proc, _ = ProcessSample.objects.filter(taken_at__lt=raw_cutoff).delete()
        pruned_rollups, _ = GpuSampleRollup.objects.filter(bucket_start__lt=rollup_cutoff).delete()
    return {
        "rollups": len(rollups),
        "raw_deleted": pruned_raw,
        "process_deleted": pruned_proc,
        "rollups_deleted": pruned_rollups,
    }


def _aware(value):  # type: ignore[no-untyped-def]
    if isinstance(value, str):  # SQLite returns text
        value = datetime.fromisoformat(value)
    if timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.utc)
    return value
