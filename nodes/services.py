"""Every write to nodes, GPUs and samples: registration, host-key approval, discovery,
sampling and ingest, drain, retention."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import re
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Avg, Case, Count, F, Max, Min, Q, Sum, Value, When
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from gpuplatform.errors import Conflict, ServiceError

from . import isolation, preflight, ssh, telemetry
from .hooks import GpuSampleRow, ProcessSampleRow, SampleBatch, run_sample_hooks
from .models import (
    Allocation,
    GateStatus,
    Gpu,
    GpuSample,
    GpuSampleRollup,
    Node,
    NodePolicy,
    NodePolicyChange,
    ProcessSample,
)

logger = logging.getLogger(__name__)

HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
SSH_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# A Docker network name (docker's own rule), never an option or a `container:` mode.
NETWORK_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$")
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


def _clean_network(network: str) -> str:
    network = (network or "").strip()
    if not NETWORK_RE.match(network) or network in ("host", "default"):
        raise ServiceError(
            "Give the name of a Docker network on the node (letters, digits, _ . -), e.g. "
            "bridge or none; host is refused, it would put slices in the node's own "
            "network namespace.",
            code="invalid_network",
            field="container_network",
        )
    return network


def _clean_registration(
    *, name: str, address: str, port: int, ssh_user: str, container_network: str
) -> dict:
    name = (name or "").strip()
    if not NAME_RE.match(name):
        raise ServiceError(
            "Use lower-case letters, digits and hyphens (up to 63), starting with a "
            "letter or digit.",
            code="invalid_name",
            field="name",
        )
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        code = "invalid"  # not a whole number
        if isinstance(port, int) and not isinstance(port, bool):
            code = "min_value" if port < 1 else "max_value"
        raise ServiceError("The SSH port must be between 1 and 65535.", code=code, field="port")
    if not SSH_USER_RE.match(ssh_user or ""):
        raise ServiceError(
            "Enter a POSIX user name (lower-case letters, digits, _ and -).",
            code="invalid_user",
            field="ssh_user",
        )
    return {
        "name": name,
        "address": _clean_address(address),
        "port": port,
        "ssh_user": ssh_user,
        "container_network": _clean_network(container_network),
    }


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
    container_network: str = "bridge",
) -> Node:
    """Register a node. With a host key (a known_hosts line ops vouch for) it is pinned
    and discovery starts; without one the node's key is read for ops to approve."""
    data = _clean_registration(
        name=name,
        address=address,
        port=port,
        ssh_user=ssh_user,
        container_network=container_network,
    )
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
        container_network=changes.get("container_network", node.container_network),
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


DISCOVERED_GPU_FIELDS = [
    "node",
    "index",
    "model",
    "vram_total_mb",
    "mig_capable",
    "mig_enabled",
    "pci_bus_id",
    "mig_devices",
    "present",
]


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
        # Locked, and saved with only the fields discovery owns: placement keeps
        # allocated_mb (and ops the ratio and the placement mark) on these rows meanwhile.
        existing = {g.uuid: g for g in Gpu.objects.select_for_update().filter(uuid__in=seen)}
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
            fields = DISCOVERED_GPU_FIELDS
            if gpu.mig_enabled:
                gpu.overcommit_ratio = 1  # MIG partitions and overcommit exclude each other
                fields = [*fields, "overcommit_ratio"]
            gpu.present = True
            if gpu.pk is None:
                gpu.save()
            else:
                gpu.save(update_fields=fields)
        caps = sample.capabilities or telemetry.Capabilities()
        # Until this discovery's preflight has judged them, cards are sold in slices only
        # where the last verdict proved the quota for their model with the same library.
        last = node.preflight or {}
        same_library = last.get("quota_library", "") == (caps.vram_quota_library or "")
        _sell_whole(node, quota=(last.get("quota") or {}) if same_library else {})
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
    # Outside the inventory's transaction: the probes take seconds.
    return node_preflight(node_id=node.pk, facts=caps.facts, pool=pool)


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
    held: dict[int, int] = defaultdict(int)  # GPU id -> MiB its processes hold
    by_container: dict[str, int] = defaultdict(int)
    for p in proc_rows:
        held[p.gpu_id] += p.used_memory_mb
        if p.container_id:
            by_container[p.container_id] += p.used_memory_mb
    books = {q.container_id: q.used_mb for _, sample in results for q in (sample.quota_usage or ())}
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
        # Allocations before GPUs: the order allocation_release locks them in.
        _count_allocations(gpu_rows, by_container, books, now)
        _update_latest(gpu_rows, held)
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
        gpu_uuids={
            gpu_id: uuid for uuid, (gpu_id, _) in gpus.items() if not uuid.startswith("MIG-")
        },
        quota_usage=books,
    )
    run_sample_hooks(batch)
    return batch


LATEST_FIELDS = [
    "last_memory_used_mb",
    "last_utilization_gpu",
    "last_utilization_memory",
    "last_temperature_c",
    "last_power_w",
    "last_processes_mb",
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


# --- placement ----------------------------------------------------------------------------


def _placeable_gpus(*, guaranteed: bool) -> models.QuerySet[Gpu]:
    """GPUs a new reservation may land on: present, accepting, on an active node."""
    gpus = Gpu.objects.filter(
        present=True,
        accepting_placements=True,
        node__status=Node.Status.ACTIVE,
        node__drained_at__isnull=True,
        node__gate_status=GateStatus.PASSED,
    )
    if guaranteed:
        # DOMAIN.md: no overcommit for work that was sold as guaranteed.
        gpus = gpus.filter(overcommit_ratio=1)
    return gpus


def _mig_candidates(*, vram_mb: int, guaranteed: bool) -> list:  # type: ignore[type-arg]
    """MIG-partitioned GPUs with their free devices (placement.choose picks the device)."""
    from .placement import Candidate, MigSlot

    with connection.cursor() as cursor:  # most fleets have none: ask cheaply first
        cursor.execute("SELECT 1 FROM nodes_gpu WHERE mig_enabled AND present LIMIT 1")
        if cursor.fetchone() is None:
            return []
    rows = list(
        _placeable_gpus(guaranteed=guaranteed)
        .filter(mig_enabled=True)
        .values_list(
            "pk", "vram_total_mb", "allocated_mb", "overcommit_ratio", "mig_enabled", "mig_devices"
        )
    )
    if not rows:
        return []
    taken_mig = set(
        Allocation.objects.exclude(state=Allocation.State.RELEASED)
        .exclude(mig_device_uuid="")
        .values_list("mig_device_uuid", flat=True)
    )
    return [
        Candidate(
            gpu_id=pk,
            total_mb=total,
            allocated_mb=allocated,
            overcommit_ratio=ratio,
            mig_enabled=mig,
            free_mig=tuple(
                MigSlot(m["uuid"], m["memory_total_mb"])
                for m in (devices or [])
                if mig and m.get("uuid") and m["uuid"] not in taken_mig
            ),
        )
        for pk, total, allocated, ratio, mig, devices in rows
    ]


def _capacity_mb(gpu: Gpu) -> int:
    from .placement import Candidate

    return Candidate(
        gpu_id=gpu.pk,
        total_mb=gpu.vram_total_mb,
        allocated_mb=gpu.allocated_mb,
        overcommit_ratio=gpu.overcommit_ratio,
    ).capacity_mb


def held_mb(gpu: Gpu) -> int:
    """What a card holds for placement: what was sold on it, or what its processes hold
    when that is more (ROOM_SQL's rule, for one row)."""
    return max(gpu.allocated_mb, gpu.last_processes_mb or 0)


def placement_shortfall(*, vram_mb: int, guaranteed: bool = True) -> str:
    """Why a launch that found no room waits, where the reason is memory the platform did
    not sell: a card with room by what was sold whose processes hold more. '' otherwise.
    Names no node or GPU (a tenant reads it)."""
    from django.db.models.expressions import RawSQL

    over = (
        _placeable_gpus(guaranteed=guaranteed)
        .filter(mig_enabled=False)
        .annotate(sold_room=RawSQL(SOLD_ROOM_SQL[connection.vendor], ()))  # noqa: S611 - constant
        .filter(sold_room__gte=vram_mb, last_processes_mb__gt=F("allocated_mb"))
        .values_list("allocated_mb", "last_processes_mb")
    )
    extra = max((held - sold for sold, held in over), default=0)
    if not extra:
        return ""
    return (
        f"A GPU with room for it by what was sold on it holds {extra} MiB more than that "
        "(memory used outside the platform), so nothing more is placed there for now."
    )


def _try_gpu(choice, *, vram_mb: int, owner_key: str, guaranteed: bool, skip_locked: bool):  # type: ignore[no-untyped-def]
    """Lock the chosen GPU's row and reserve on it if it still has room.

    Returns the allocation, False when the GPU no longer fits, or None when another
    reservation holds its lock (only with skip_locked)."""
    gpu = (
        _placeable_gpus(guaranteed=guaranteed)
        .select_related("node")
        .select_for_update(of=("self",), skip_locked=skip_locked)
        .filter(pk=choice.gpu_id)
        .first()
    )
    if gpu is None:
        if skip_locked and Gpu.objects.filter(pk=choice.gpu_id).exists():
            return None
        return False
    if choice.mig_device_uuid:
        taken = Allocation.objects.filter(mig_device_uuid=choice.mig_device_uuid).exclude(
            state=Allocation.State.RELEASED
        )
        if taken.exists():
            return False
    elif held_mb(gpu) + vram_mb > _capacity_mb(gpu):
        return False
    return _create_allocation(
        gpu, vram_mb, owner_key, guaranteed, mig_device_uuid=choice.mig_device_uuid
    )


@transaction.atomic(savepoint=False)  # the caller's transaction, or its own
def allocation_reserve(
    *, owner_key: str, vram_mb: int, guaranteed: bool = True
) -> Allocation | None:
    """Reserve `vram_mb` for `owner_key` on the best GPU, or return None (no capacity).

    The rules are placement.choose's: an exact free MIG device first, else best fit
    under total x ratio. Software slices are chosen and locked in one statement (the
    same best-fit rule in SQL, `FOR UPDATE SKIP LOCKED`), so parallel launches take
    different GPUs instead of queueing on one row; a GPU another launch holds is waited
    for only when nothing else fits. A reservation holds one GPU lock at a time (no
    deadlock), and allocated VRAM never exceeds capacity (a database constraint backs
    this). The lock is held until the caller's transaction commits."""
    from .placement import choose

    if vram_mb <= 0:
        raise ServiceError("A reservation needs some VRAM.", field="vram_mb")
    candidates = _mig_candidates(vram_mb=vram_mb, guaranteed=guaranteed)
    busy = []
    while candidates:
        choice = choose(candidates, vram_mb)
        if choice is None or not choice.mig_device_uuid:
            break
        result = _try_in_savepoint(choice, vram_mb, owner_key, guaranteed, skip_locked=True)
        if result:
            return result
        if result is None:
            busy.append(choice)
        candidates = _without(candidates, choice)
    for choice in busy:
        result = _try_in_savepoint(choice, vram_mb, owner_key, guaranteed, skip_locked=False)
        if result:
            return result
    result = _reserve_software(vram_mb, owner_key, guaranteed, skip_locked=True)
    if result is not None:
        return result
    # Everything that fits may be locked by other launches: wait for the best one, a
    # single row at a time (a scan that waits could hold rows it then skips).
    for _ in range(MAX_PLACEMENT_ATTEMPTS):
        best = _software_fits(vram_mb, guaranteed).values_list("pk", flat=True).first()
        if best is None:
            return None
        result = _reserve_software(vram_mb, owner_key, guaranteed, skip_locked=False, pk=best)
        if result is not None:
            return result
    return None


MAX_PLACEMENT_ATTEMPTS = 5


# placement.nominal_mb and Candidate.capacity_mb in SQL, in integers where possible;
# capacity is rounded down (FLOOR; SQLite's CAST truncates, the same for positives).
# The PostgreSQL form is also the expression of the index nodes_gpu_room_idx
# (migration 0004): change both together (test_room_index_serves_placement).
_NEAREST = "((vram_total_mb + 512) / 1024 * 1024)"
_NOMINAL = (
    f"CASE WHEN {_NEAREST} >= vram_total_mb AND ({_NEAREST} - vram_total_mb) * 50 <= {_NEAREST} "
    f"THEN {_NEAREST} ELSE vram_total_mb END"
)
_CAPACITY = {
    "postgresql": f"FLOOR(({_NOMINAL}) * overcommit_ratio)::integer",
    "sqlite": f"CAST(({_NOMINAL}) * overcommit_ratio AS INTEGER)",
}
# A card's room counts what it really holds: the larger of what was sold on it and what
# its processes hold (memory used outside the platform, a library that undercounts).
_HELD = {
    "postgresql": "GREATEST(allocated_mb, COALESCE(last_processes_mb, 0))",
    "sqlite": "MAX(allocated_mb, COALESCE(last_processes_mb, 0))",
}
ROOM_SQL = {vendor: f"({cap} - {_HELD[vendor]})" for vendor, cap in _CAPACITY.items()}
# A card sold whole only (no proven quota library) takes one slice, of the whole card.
WHOLE_CARD_SQL = {
    vendor: f"(NOT whole_card_only OR ({held} = 0 AND %s >= {_NOMINAL}))"
    for vendor, held in _HELD.items()
}
# The room by what was sold alone (why a launch waits: placement_shortfall).
SOLD_ROOM_SQL = {vendor: f"({cap} - allocated_mb)" for vendor, cap in _CAPACITY.items()}


def _software_fits(vram_mb: int, guaranteed: bool) -> models.QuerySet[Gpu]:
    from django.db.models.expressions import RawSQL

    return (
        _placeable_gpus(guaranteed=guaranteed)
        .filter(mig_enabled=False)
        .annotate(room=RawSQL(ROOM_SQL[connection.vendor], ()))  # noqa: S611 - constant
        .filter(room__gte=vram_mb)
        .annotate(whole_ok=RawSQL(WHOLE_CARD_SQL[connection.vendor], (vram_mb,)))  # noqa: S611
        .filter(whole_ok=True)
        .order_by("room", "pk")
    )


def _reserve_software(vram_mb, owner_key, guaranteed, *, skip_locked, pk=None):  # type: ignore[no-untyped-def]
    """Best fit among non-MIG GPUs (or GPU `pk`), chosen and locked by one query. None:
    nothing fits (or, with skip_locked, all that fits is locked by other launches)."""
    if skip_locked:
        gpu = _claim_best_fit(vram_mb, guaranteed)
        if gpu is None:
            return None
        return _create_allocation(
            gpu, vram_mb, owner_key, guaranteed, mig_device_uuid="", counted=True
        )
    # Waiting for a lock: a row whose room went meanwhile must not stay locked.
    gpus = _software_fits(vram_mb, guaranteed)
    if pk is not None:
        gpus = gpus.filter(pk=pk)
    gpus = gpus.select_related("node").select_for_update(of=("self",))
    sid = transaction.savepoint()
    try:
        gpu = gpus.first()
        if gpu is None or held_mb(gpu) + vram_mb > _capacity_mb(gpu):
            transaction.savepoint_rollback(sid)
            return None
        allocation = _create_allocation(gpu, vram_mb, owner_key, guaranteed, mig_device_uuid="")
    except BaseException:
        transaction.savepoint_rollback(sid)
        raise
    transaction.savepoint_commit(sid)
    return allocation


def _claim_best_fit(vram_mb: int, guaranteed: bool) -> Gpu | None:
    """The hot path of every launch, in one statement: choose the best-fit GPU that no
    other launch holds (SKIP LOCKED), lock it and count the VRAM on it. The row comes
    back locked and current, so its room is what the WHERE clause saw."""
    vendor = connection.vendor
    lock = "FOR UPDATE OF g SKIP LOCKED" if vendor == "postgresql" else ""
    only_whole = "AND g.overcommit_ratio = 1" if guaranteed else ""
    room = ROOM_SQL[vendor]
    sql = f"""
        UPDATE nodes_gpu SET allocated_mb = allocated_mb + %s
        WHERE id = (
            SELECT g.id FROM nodes_gpu g JOIN nodes_node n ON n.id = g.node_id
            WHERE g.present AND g.accepting_placements AND NOT g.mig_enabled
              AND n.status = %s AND n.drained_at IS NULL AND n.gate_status = %s {only_whole}
              AND {room} >= %s AND {WHOLE_CARD_SQL[vendor]}
            ORDER BY {room}, g.id LIMIT 1 {lock}
        )
        RETURNING {", ".join(f'"{name}"' for name in _CLAIM_FIELDS)}
    """  # noqa: S608 - fixed SQL; the values are parameters
    if vendor == "postgresql":  # the node's name for the slice's timeline, in one go
        sql += ", (SELECT name FROM nodes_node WHERE nodes_node.id = nodes_gpu.node_id)"
    with connection.cursor() as cursor:
        cursor.execute(sql, [vram_mb, Node.Status.ACTIVE, GateStatus.PASSED, vram_mb, vram_mb])
        row = cursor.fetchone()
    if row is None:
        return None
    gpu = Gpu(**dict(zip(_CLAIM_FIELDS, row, strict=False)))
    gpu._state.adding = False
    if len(row) > len(_CLAIM_FIELDS):
        gpu.node = Node(pk=gpu.node_id, name=row[-1])
        gpu.node._state.adding = False
    return gpu


# What a claimed GPU row brings back: enough for the allocation and the timeline.
_CLAIM_FIELDS = (
    "id",
    "node_id",
    "index",
    "uuid",
    "vram_total_mb",
    "overcommit_ratio",
    "allocated_mb",
    "mig_enabled",
)


def _create_allocation(gpu, vram_mb, owner_key, guaranteed, *, mig_device_uuid, counted=False):  # type: ignore[no-untyped-def]
    # Always called inside the caller's savepoint, which an IntegrityError rolls back.
    try:
        allocation = Allocation.objects.create(
            gpu=gpu,
            vram_mb=vram_mb,
            owner_key=owner_key,
            mig_device_uuid=mig_device_uuid,
            guaranteed=guaranteed,
        )
    except IntegrityError as exc:
        raise Conflict(
            "This owner already holds VRAM.", code="already_allocated", field="owner_key"
        ) from exc
    if not counted:
        Gpu.objects.filter(pk=gpu.pk).update(allocated_mb=F("allocated_mb") + vram_mb)
        gpu.allocated_mb += vram_mb
    return allocation


def _try_in_savepoint(choice, vram_mb, owner_key, guaranteed, *, skip_locked):  # type: ignore[no-untyped-def]
    # Rolling back the savepoint drops the row lock of a GPU that did not fit, so a
    # reservation holds at most one GPU lock while it waits: no deadlock cycle.
    sid = transaction.savepoint()
    try:
        result = _try_gpu(
            choice,
            vram_mb=vram_mb,
            owner_key=owner_key,
            guaranteed=guaranteed,
            skip_locked=skip_locked,
        )
    except BaseException:
        transaction.savepoint_rollback(sid)
        raise
    if result:
        transaction.savepoint_commit(sid)
    else:
        transaction.savepoint_rollback(sid)
    return result


def _without(candidates: list, choice) -> list:  # type: ignore[no-untyped-def, type-arg]
    """Drop the chosen GPU (or, for MIG, only the chosen device) from the candidates."""
    from dataclasses import replace

    out = []
    for c in candidates:
        if c.gpu_id != choice.gpu_id:
            out.append(c)
        elif choice.mig_device_uuid:
            rest = tuple(m for m in c.free_mig if m.uuid != choice.mig_device_uuid)
            if rest:
                out.append(replace(c, free_mig=rest))
    return out


@transaction.atomic
def allocation_release(*, allocation: Allocation) -> Allocation:
    """Give the VRAM back. Safe to run twice. Locks the allocation, then its GPU."""
    allocation = Allocation.objects.select_for_update().get(pk=allocation.pk)
    if allocation.state != Allocation.State.RELEASED:
        Gpu.objects.select_for_update().filter(pk=allocation.gpu_id).update(
            allocated_mb=Greatest(F("allocated_mb") - allocation.vram_mb, 0)
        )
        allocation.state = Allocation.State.RELEASED
        allocation.released_at = timezone.now()
        allocation.save(update_fields=["state", "released_at"])
    return allocation


@transaction.atomic
def allocation_activate(*, allocation: Allocation, container_id: str) -> Allocation:
    """The container holding this VRAM runs: record it."""
    updated = (
        Allocation.objects.filter(pk=allocation.pk)
        .exclude(state=Allocation.State.RELEASED)
        .update(state=Allocation.State.ACTIVE, container_id=container_id)
    )
    if not updated:
        raise Conflict("This allocation was released.", code="allocation_released")
    allocation.refresh_from_db()
    return allocation


def gpus_recount_allocations() -> int:
    """Repair each GPU's allocated counter from its live allocations; returns GPUs fixed."""
    fixed = 0
    live = ~Q(allocations__state=Allocation.State.RELEASED)
    drift = Gpu.objects.annotate(
        live_mb=Coalesce(Sum("allocations__vram_mb", filter=live), 0)
    ).exclude(allocated_mb=F("live_mb"))
    for gpu_id in drift.values_list("pk", flat=True):
        with transaction.atomic():
            gpu = Gpu.objects.select_for_update().get(pk=gpu_id)
            total = (
                Allocation.objects.filter(gpu=gpu)
                .exclude(state=Allocation.State.RELEASED)
                .aggregate(t=Coalesce(Sum("vram_mb"), 0))["t"]
            )
            if gpu.allocated_mb != total:
                logger.warning(
                    "GPU %s counter %s MiB, live %s MiB: fixed", gpu.pk, gpu.allocated_mb, total
                )
                try:
                    with transaction.atomic():
                        Gpu.objects.filter(pk=gpu.pk).update(allocated_mb=total)
                except IntegrityError:
                    # More is placed than the GPU can hold (e.g. its ratio was lowered by
                    # hand): keep new work off it and say so, rather than fail the round.
                    logger.error("GPU %s holds %s MiB, over its capacity", gpu.pk, total)
                    Gpu.objects.filter(pk=gpu.pk).update(
                        accepting_placements=False,
                        not_accepting_reason=f"{total} MiB placed: over capacity, check it",
                    )
                    continue
                fixed += 1
    return fixed


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
        # '%%%%s': the template's own %-formatting leaves '%%s', which the SQLite backend
        # turns into strftime's literal '%s' (a bare '%s' would be a query parameter)
        return self.as_sql(
            compiler,
            connection,
            template="datetime((CAST(strftime('%%%%s', %(expressions)s) AS INTEGER) / 300) * 300,"
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


# --- containers ------------------------------------------------------------------------------


class ContainerError(Exception):
    """The node refused or failed a container operation; the message says why."""

    def __init__(self, message: str, *, info=None):  # type: ignore[no-untyped-def]
        super().__init__(message)
        self.info = info


CONTAINER_START_TIMEOUT = 120.0  # an image pull on first use can take a while


def _docker(node: Node, argv: list[str], pool: ssh.SSHPool | None, timeout: float | None = None):  # type: ignore[no-untyped-def]
    pool = pool or ssh.get_pool()
    return pool.run(endpoint_for(node), argv, timeout=timeout)


_CLI_HINT_RE = re.compile(r"^(?:See|Run) 'docker [a-z ]+--help'")


def _last_line(data: bytes) -> str:
    """The error line of a CLI's output: the last line that is not docker's usage hint
    ("See 'docker run --help'." / "Run 'docker run --help' for more information")."""
    lines = [
        ln.strip()
        for ln in data.decode("utf-8", "replace").strip().splitlines()
        if ln.strip() and not _CLI_HINT_RE.match(ln.strip())
    ]
    return (lines[-1].removeprefix("docker: ") if lines else "")[:400]


def container_inspect(*, node: Node, container: str, pool: ssh.SSHPool | None = None):  # type: ignore[no-untyped-def]
    """The container's state, or None when the node has no such container."""
    from . import runtime

    result = _docker(node, runtime.inspect_argv(container), pool)
    if not result.ok:
        if b"No such" in result.stderr:
            return None
        raise ContainerError(f"docker inspect failed: {_last_line(result.stderr)}")
    infos = runtime.parse_inspect(result.stdout.decode("utf-8", "replace"))
    return infos[0] if infos else None


def container_logs_tail(
    *, node: Node, container: str, lines: int = 20, pool: ssh.SSHPool | None = None
) -> str:
    from . import runtime

    try:
        result = _docker(node, runtime.logs_tail_argv(container, lines), pool)
    except ssh.SSHError:
        return ""
    return (result.stdout + result.stderr).decode("utf-8", "replace")[-2000:]


def image_inspect(*, node: Node, reference: str, pool: ssh.SSHPool | None = None):  # type: ignore[no-untyped-def]
    """The image's configuration as the node has it (pulled first when the node lacks it).
    Raises ContainerError (no such image, a pull refused) or ssh.SSHError."""
    from . import runtime

    argv = runtime.image_inspect_argv(reference)
    result = _docker(node, argv, pool)
    if not result.ok and b"No such image" in result.stderr:
        pulled = _docker(node, runtime.pull_argv(reference), pool, timeout=CONTAINER_START_TIMEOUT)
        if not pulled.ok:
            raise ContainerError(f"docker pull failed: {_last_line(pulled.stderr)}")
        result = _docker(node, argv, pool)
    if not result.ok:
        raise ContainerError(f"docker image inspect failed: {_last_line(result.stderr)}")
    try:
        return runtime.parse_image_inspect(result.stdout.decode("utf-8", "replace"))
    except runtime.RuntimeParseError as exc:
        raise ContainerError(str(exc)) from None


def image_env_refusal(config) -> str:  # type: ignore[no-untyped-def]
    """Why an image cannot run as a slice, from its own configuration ('' when it can)."""
    bad = isolation.image_env_problems(config.env)
    return "; ".join(f"the image's configuration sets {name}: {why}" for name, why in bad)


def container_start(
    *,
    allocation: Allocation,
    name: str,
    image: str,
    cpus,  # type: ignore[no-untyped-def]
    memory_mb: int,
    pids_limit: int,
    command: list[str],
    environment: dict[str, str],
    ports: list[int],
    pool: ssh.SSHPool | None = None,
):
    """Start the allocation's container with its VRAM quota by the strongest layer the
    node has, and check it runs. Safe to repeat: a container of this name that already
    carries this owner's label (an earlier attempt) is adopted, not started twice.

    Raises ContainerError (refused, or exited at once: `.info` has its state) or
    ssh.SSHError (the node did not answer)."""
    from . import runtime

    allocation = Allocation.objects.select_related("gpu__node").get(pk=allocation.pk)
    if allocation.state == Allocation.State.RELEASED:
        raise ContainerError("The VRAM allocation was released before the container started.")
    gpu, node = allocation.gpu, allocation.gpu.node
    mig = bool(allocation.mig_device_uuid)
    # Under MIG, CUDA (and JAX's memory fraction) sees the MIG device, not the whole GPU.
    device_mb = gpu.vram_total_mb
    if mig:
        device_mb = (
            next(
                (
                    int(m.get("memory_total_mb") or 0)
                    for m in gpu.mig_devices or []
                    if m.get("uuid") == allocation.mig_device_uuid
                ),
                0,
            )
            or allocation.vram_mb
        )
    spec = runtime.ContainerSpec(
        name=name,
        image=image,
        owner_key=allocation.owner_key,
        device=allocation.mig_device_uuid or gpu.uuid,
        vram_mb=min(allocation.vram_mb, device_mb),
        gpu_total_mb=device_mb,
        cpus=cpus,
        memory_mb=memory_mb,
        pids_limit=pids_limit,
        command=tuple(command),
        environment=tuple(sorted(environment.items())),
        ports=tuple(ports),
        mig=mig,
        quota_library="" if mig else (node.capabilities or {}).get("vram_quota_library") or "",
        network=node.container_network,
    )
    argv = runtime.run_argv(spec)
    # Before anything starts (the toolkit's hook runs with the image's environment at
    # prestart: CVE-2025-23266), the image as this node has it, whatever its tag meant
    # when ops allowlisted it.
    refusal = image_env_refusal(image_inspect(node=node, reference=image, pool=pool))
    if refusal:
        raise ContainerError(refusal)
    result = _docker(node, argv, pool, timeout=CONTAINER_START_TIMEOUT)
    if result.ok:
        container_id = result.stdout.decode().strip().splitlines()[-1].strip()
    elif b"is already in use" in result.stderr:
        container_id = name
    else:
        raise ContainerError(f"docker run failed: {_last_line(result.stderr)}")
    info = container_inspect(node=node, container=container_id, pool=pool)
    if info is None or info.owner_key != allocation.owner_key:
        raise ContainerError(f"container {name} is not ours or is gone")
    if not info.running and info.status == "created":
        started = _docker(node, ["docker", "start", info.id], pool)
        if not started.ok:
            raise ContainerError(f"docker start failed: {_last_line(started.stderr)}", info=info)
        info = container_inspect(node=node, container=info.id, pool=pool)
    settle = settings.NODES_CONTAINER_SETTLE_S
    if info is not None and info.running and settle > 0:
        time.sleep(settle)  # a container that crashes on start does so within moments
        info = container_inspect(node=node, container=info.id, pool=pool)
    if info is None or not info.running:
        raise ContainerError(container_exit_reason(info), info=info)
    # What runs must carry the platform's isolation, whatever the image or anything else
    # set: the quota variables with the platform's values, nothing that switches them off.
    wrong = isolation.container_env_problems(info.env, dict(runtime.platform_env(spec)))
    if wrong:
        raise ContainerError(
            "the started container's environment does not hold the platform's isolation: "
            + "; ".join(wrong),
            info=info,
        )
    return info


def container_exit_reason(info) -> str:  # type: ignore[no-untyped-def]
    """Why a container is not running, in words."""
    if info is None:
        return "the container disappeared"
    if info.oom_killed:
        return f"the container was killed out of memory (exit {info.exit_code})"
    if info.error:
        return f"the container failed: {info.error[:300]}"
    return f"the container exited with code {info.exit_code}"


def container_remove(
    *, node: Node, container: str, grace_s: int = 10, pool: ssh.SSHPool | None = None
) -> bool:
    """Stop (SIGTERM, then SIGKILL after `grace_s`) and remove a container. True if it existed."""
    from . import runtime

    stopped = _docker(node, runtime.stop_argv(container, grace_s), pool, timeout=grace_s + 20)
    if not stopped.ok and b"No such" not in stopped.stderr:
        raise ContainerError(f"docker stop failed: {_last_line(stopped.stderr)}")
    removed = _docker(node, runtime.rm_argv(container), pool)
    if removed.ok:
        return True
    if b"No such" in removed.stderr:
        return stopped.ok
    raise ContainerError(f"docker rm failed: {_last_line(removed.stderr)}")


def node_containers(*, node: Node, pool: ssh.SSHPool | None = None) -> list:  # type: ignore[type-arg]
    """Every platform-labelled container on the node, running or not."""
    from . import runtime

    result = _docker(node, runtime.ps_argv(), pool)
    if not result.ok:
        raise ContainerError(f"docker ps failed: {_last_line(result.stderr)}")
    return runtime.parse_ps(result.stdout.decode("utf-8", "replace"))


def container_event_record(
    *, node: Node, container_id: str, owner_key: str, action: str, detail: str
) -> None:
    from .models import ContainerEvent

    ContainerEvent.objects.create(
        node=node,
        container_id=container_id[:128],
        owner_key=owner_key[:128],
        action=action,
        detail=detail[:500],
    )


# --- GPU placement policy ---------------------------------------------------------------------

MIN_HISTORY_DAYS = 7
MAX_HISTORY_DAYS = 30


def rollup_windows(*, gpu_ids: list[int], now: datetime | None = None) -> dict[int, dict]:
    """Per GPU, over the last 30 days of rollups: the first bucket, the peak, and on how
    many distinct days there are samples at all (one query for a page of GPUs)."""
    from django.db.models.functions import TruncDate

    now = now or timezone.now()
    rows = (
        GpuSampleRollup.objects.filter(
            gpu_id__in=gpu_ids, bucket_start__gte=now - timedelta(days=MAX_HISTORY_DAYS)
        )
        .values("gpu_id")
        .annotate(
            first=Min("bucket_start"),
            peak=Max("memory_used_max_mb"),
            days=Count(TruncDate("bucket_start"), distinct=True),
        )
        .order_by()
    )
    return {row["gpu_id"]: row for row in rows}


def gpu_recommended_ratio(
    *, gpu: Gpu, now: datetime | None = None, window: dict | None = None
) -> dict:
    """The highest overcommit ratio DOMAIN.md allows for this GPU: physical VRAM over the
    peak use seen in the last 7-30 days of rollups, rounded down; None unless samples
    cover at least 7 distinct days (two samples a week apart are not a week of history)."""
    from decimal import ROUND_DOWN, Decimal

    now = now or timezone.now()
    if window is None:
        window = rollup_windows(gpu_ids=[gpu.pk], now=now).get(gpu.pk)
    window = window or {"first": None, "peak": None, "days": 0}
    covered = int(window["days"] or 0)
    out = {"days_of_history": covered, "peak_mb": window["peak"], "ratio": None}
    if gpu.mig_enabled:
        out["reason"] = "MIG partitions and overcommit exclude each other."
    elif covered < MIN_HISTORY_DAYS or not window["peak"]:
        out["reason"] = (
            f"Needs samples on {MIN_HISTORY_DAYS} days; this GPU has {covered}. "
            "A ratio is never guessed."
        )
    else:
        ratio = Decimal(gpu.vram_total_mb) / Decimal(window["peak"])
        ratio = min(max(ratio, Decimal("1.00")), Decimal("4.00")).quantize(
            Decimal("0.01"), rounding=ROUND_DOWN
        )
        out["ratio"] = ratio
        out["reason"] = (
            f"{gpu.vram_total_mb} MiB physical / {window['peak']} MiB peak over "
            f"{covered} days with samples."
        )
    return out


@transaction.atomic
def gpu_set_overcommit(*, gpu: Gpu, ratio, now: datetime | None = None) -> Gpu:  # type: ignore[no-untyped-def]
    """Set the GPU's overcommit ratio, only where DOMAIN.md allows it."""
    from decimal import Decimal, InvalidOperation

    try:
        ratio = Decimal(str(ratio))
        if not ratio.is_finite():
            raise InvalidOperation
        ratio = ratio.quantize(Decimal("0.01"))
    except (InvalidOperation, ValueError) as exc:
        raise ServiceError("The ratio must be a number.", field="overcommit_ratio") from exc
    if not Decimal("1.00") <= ratio <= Decimal("4.00"):
        raise ServiceError(
            "The ratio must be between 1.00 and 4.00.",
            code="min_value" if ratio < Decimal("1.00") else "max_value",
            field="overcommit_ratio",
        )
    gpu = Gpu.objects.select_for_update().get(pk=gpu.pk)
    if ratio > Decimal("1.00"):
        if gpu.mig_enabled:
            raise Conflict(
                "This GPU is MIG-partitioned: MIG and overcommit exclude each other.",
                code="mig_enabled",
                field="overcommit_ratio",
            )
        guaranteed = Allocation.objects.filter(gpu=gpu, guaranteed=True).exclude(
            state=Allocation.State.RELEASED
        )
        if guaranteed.exists():
            raise Conflict(
                "Guaranteed slices run on this GPU; they are never overcommitted. "
                "Wait until they stop or move them first.",
                code="guaranteed_slices",
                field="overcommit_ratio",
            )
        rec = gpu_recommended_ratio(gpu=gpu, now=now)
        if rec["ratio"] is None or ratio > rec["ratio"]:
            allowed = rec["ratio"] if rec["ratio"] is not None else "1.00"
            raise Conflict(
                f"At most {allowed} for this GPU: {rec['reason']}",
                code="ratio_above_recommended",
                field="overcommit_ratio",
            )
    gpu.overcommit_ratio = ratio
    if gpu.allocated_mb > _capacity_mb(gpu):
        raise Conflict(
            f"{gpu.allocated_mb} MiB is allocated on this GPU; the ratio cannot go below "
            "what is already placed.",
            code="below_allocated",
            field="overcommit_ratio",
        )
    gpu.overcommit_ratio = ratio
    gpu.save(update_fields=["overcommit_ratio"])
    return gpu


@transaction.atomic
def gpu_set_accepting(*, gpu: Gpu, accepting: bool, reason: str = "") -> Gpu:
    """Open or close a GPU to new placements (running work continues)."""
    gpu = Gpu.objects.select_for_update().get(pk=gpu.pk)
    if not accepting and not reason.strip():
        raise ServiceError("Say why the GPU stops taking placements.", field="reason")
    gpu.accepting_placements = accepting
    gpu.not_accepting_reason = "" if accepting else reason.strip()[:500]
    gpu.save(update_fields=["accepting_placements", "not_accepting_reason"])
    return gpu


# --- the preflight gate ---------------------------------------------------------------------

PROBE_OWNER_PREFIX = "probe-node-"  # a probe container's owner key: "probe-node-<node id>"
PROBE_WAIT_S = 30.0  # a probe that has not finished by then counts as not finished
POLICY_FIELDS = (
    "min_toolkit_version",
    "min_runc_version",
    "driver_branches",
    "known_fixed_builds",
    "probe_image",
    "probe_command",
    "probe_environment",
)


def node_policy() -> NodePolicy:
    """The one policy row (made with the defaults on first use)."""
    policy = NodePolicy.objects.filter(pk=1).first()
    if policy is None:
        policy, _ = NodePolicy.objects.get_or_create(pk=1)
    return policy


def _gate_policy(row: NodePolicy) -> preflight.Policy:
    return preflight.Policy(
        min_toolkit_version=row.min_toolkit_version,
        min_runc_version=row.min_runc_version,
        driver_branches=tuple(row.driver_branches or ()),
        known_fixed=tuple(
            preflight.KnownBuild(k["component"], k["build"], k.get("reason", ""))
            for k in row.known_fixed_builds or ()
        ),
    )


def _probe_targets(node: Node) -> list[tuple[Gpu, str, int, bool]]:
    """One GPU of each model sold through the quota library (the least used one), or,
    on a node with MIG-partitioned GPUs only, one MIG device (for the hardening reading):
    (gpu, device, device MiB, mig)."""
    # the freest card of each model: the probe's 512 MiB must not be what runs a card out
    gpus = sorted(
        Gpu.objects.filter(node=node, present=True),
        key=lambda g: (max(g.allocated_mb, g.last_processes_mb or 0), g.index),
    )
    targets: dict[str, tuple[Gpu, str, int, bool]] = {}
    for gpu in gpus:
        if not gpu.mig_enabled and gpu.model not in targets:
            targets[gpu.model] = (gpu, gpu.uuid, gpu.vram_total_mb, False)
    if targets:
        return list(targets.values())
    for gpu in gpus:
        for mig in gpu.mig_devices or []:
            if mig.get("uuid"):
                return [(gpu, mig["uuid"], int(mig.get("memory_total_mb") or 0), True)]
    return []


PROBES_AT_ONCE = 4


def _probe_run(  # type: ignore[no-untyped-def]
    node: Node,
    target,
    kind: str,
    row: NodePolicy,
    library: str,
    pool: ssh.SSHPool,
    deadline: float,
) -> preflight.ProbeRun:
    """One probe container through the same `docker run` argv as a tenant's slice."""
    import secrets
    from decimal import Decimal

    from . import runtime

    gpu, device, device_mb, mig = target
    alloc_mb = preflight.PROBE_PAST_MB if kind == "past" else preflight.PROBE_WITHIN_MB
    run = preflight.ProbeRun(gpu_model=gpu.model, device=device, kind=kind)
    if time.monotonic() > deadline:
        return dataclasses.replace(run, error="the preflight ran out of time before this probe")
    try:
        spec = runtime.ContainerSpec(
            name=f"gpp-probe-{node.pk}-{gpu.index}-{kind}-{secrets.token_hex(3)}",
            image=row.probe_image,
            owner_key=f"{PROBE_OWNER_PREFIX}{node.pk}",
            device=device,
            vram_mb=min(preflight.PROBE_QUOTA_MB, device_mb or preflight.PROBE_QUOTA_MB),
            gpu_total_mb=device_mb or preflight.PROBE_QUOTA_MB,
            cpus=Decimal(preflight.PROBE_CPUS),
            memory_mb=preflight.PROBE_MEMORY_MB,
            pids_limit=preflight.PROBE_PIDS,
            command=("sh", "-c", preflight.PROBE_SCRIPT, "probe", *row.probe_command),
            environment=preflight.probe_environment(row.probe_environment or {}, alloc_mb),
            mig=mig,
            quota_library="" if mig else library,
            network=node.container_network,
        )
        argv = runtime.run_argv(spec)
    except ValueError as exc:
        return dataclasses.replace(run, error=f"the probe settings are not valid: {exc}")
    name = spec.name
    try:
        started = _docker(node, argv, pool, timeout=PROBE_WAIT_S)
        if not started.ok:
            return dataclasses.replace(
                run, error=f"docker run failed: {_last_line(started.stderr)}"
            )
        deadline = min(deadline, time.monotonic() + PROBE_WAIT_S)
        info = container_inspect(node=node, container=name, pool=pool)
        while info is not None and info.running and time.monotonic() < deadline:
            time.sleep(0.25)
            info = container_inspect(node=node, container=name, pool=pool)
        if info is None:
            return dataclasses.replace(run, error="the probe container disappeared")
        if info.running:
            return dataclasses.replace(
                run, error=f"the probe did not finish within {PROBE_WAIT_S:.0f} s"
            )
        logs = _docker(node, runtime.logs_tail_argv(name, 200), pool)
        readings = preflight.parse_probe_output(logs.stdout.decode("utf-8", "replace"))
        if "alloc_exit" not in readings:
            return dataclasses.replace(
                run,
                error=f"the probe stopped before its allocation ({container_exit_reason(info)})",
                readings=readings,
            )
        return dataclasses.replace(run, readings=readings)
    except (ssh.SSHError, ContainerError, runtime.RuntimeParseError) as exc:
        return dataclasses.replace(run, error=str(exc)[:300])
    finally:
        with contextlib.suppress(ssh.SSHError):
            _docker(node, runtime.rm_argv(name), pool)


def _remove_stale_probes(node: Node, pool: ssh.SSHPool) -> None:
    """Probe containers an earlier preflight left (its worker died mid-probe)."""
    from . import runtime

    key = f"{PROBE_OWNER_PREFIX}{node.pk}"
    with contextlib.suppress(ssh.SSHError, ContainerError, runtime.RuntimeParseError):
        for info in node_containers(node=node, pool=pool):
            if info.owner_key == key:
                _docker(node, runtime.rm_argv(info.id), pool)


def node_preflight(
    *, node_id: int, facts: dict[str, str], pool: ssh.SSHPool | None = None
) -> Node | None:
    """Judge the node by the policy: the versions discovery read, and probe containers on
    each GPU model proving the hardening and the VRAM quota. Stores the verdict; a node
    that fails takes no new placements (running slices stay), one that passes again is
    released. Never raises for what the node answers: a probe that fails says why."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None or not node.host_key:
        return node
    with _preflight_claim(node_id) as claimed:
        if not claimed:  # another worker is judging this node now: its verdict will land
            return node
        return _node_preflight(node, facts, pool or ssh.get_pool())


@contextlib.contextmanager
def _preflight_claim(node_id: int):  # type: ignore[no-untyped-def]
    """One preflight per node at a time (discoveries, the daily run, a policy change and
    "run now" can overlap): a PostgreSQL advisory lock held by this session, not a row
    lock, so nothing else waits on it. Elsewhere (SQLite, one process) always claimed."""
    if connection.vendor != "postgresql":
        yield True
        return
    key = PREFLIGHT_LOCK_SPACE + node_id
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        claimed = bool(cursor.fetchone()[0])
    try:
        yield claimed
    finally:
        if claimed:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


PREFLIGHT_LOCK_SPACE = 0x6770_0000_0000  # advisory-lock keys of preflights: this + node id
PREFLIGHT_DEADLINE_S = 240.0  # the task's soft limit is 300 s: the verdict is always stored


def _node_preflight(node: Node, facts: dict[str, str], pool: ssh.SSHPool) -> Node:
    node_id = node.pk
    row = node_policy()
    library = (node.capabilities or {}).get("vram_quota_library") or ""
    deadline = time.monotonic() + PREFLIGHT_DEADLINE_S
    _remove_stale_probes(node, pool)
    targets = _probe_targets(node)
    # The probe image is checked like any image before it starts (CVE-2025-23266 needs
    # only an ENV in it), and pulled once here rather than by each probe's `docker run`.
    image_error = ""
    try:
        image_error = image_env_refusal(
            image_inspect(node=node, reference=row.probe_image, pool=pool)
        )
    except (ContainerError, ssh.SSHError) as exc:
        image_error = f"the probe image {row.probe_image} is not usable on the node: {exc}"
    jobs = [
        (target, kind)
        for target in targets
        for kind in (("within", "past") if library and not target[3] else ("within",))
    ]
    if image_error:
        runs = [preflight.ProbeRun(t[0].model, t[1], k, error=image_error) for t, k in jobs]
    else:
        # side by side (the SSH pool is shared by threads): a node's probes take about as
        # long as one; each waits at most until the deadline
        with ThreadPoolExecutor(max_workers=PROBES_AT_ONCE) as pool_of_probes:
            futures = [
                pool_of_probes.submit(_probe_run, node, t, k, row, library, pool, deadline)
                for t, k in jobs
            ]
            runs = [f.result() for f in futures]
    software = [t[0].model for t in targets if not t[3]]
    gate = preflight.evaluate(
        facts=facts,
        driver_version=node.driver_version,
        policy=_gate_policy(row),
        runs=runs,
        software_models=software,
        quota_library=library,
        probe_error=image_error if targets else "the node has no GPU to probe",
    )
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        node.gate_status = GateStatus.PASSED if gate.passed else GateStatus.FAILED
        node.gate_reason = gate.reason[:1000]
        node.gate_checked_at = now
        node.preflight = {
            "facts": {k: facts.get(k, "") for k in preflight.FACT_KEYS},
            "driver_version": node.driver_version,
            "checks": [c.as_dict() for c in gate.checks],
            "quota": dict(gate.quota),
            "quota_library": library,
            "probes": [r.as_dict() for r in runs],
            "policy": {
                "min_toolkit_version": row.min_toolkit_version,
                "min_runc_version": row.min_runc_version,
            },
            "checked_at": now.isoformat(),
        }
        node.save(update_fields=["gate_status", "gate_reason", "gate_checked_at", "preflight"])
        _sell_whole(node, quota=gate.quota)
    return node


def _sell_whole(node: Node, *, quota) -> None:  # type: ignore[no-untyped-def]
    """The one rule for `whole_card_only`: a card that is not MIG-partitioned is sold whole
    unless the quota of its model is proven (`quota`: model -> state) or ops accepted
    watchdog-only enforcement for the node."""
    proven = preflight.proven_models(quota)
    if node.watchdog_only_accepted_at is not None:
        whole = Q(pk__in=[])
    else:
        whole = Q(mig_enabled=False) & ~Q(model__in=proven)
    cards = Gpu.objects.filter(node=node)
    cards.filter(whole).exclude(whole_card_only=True).update(whole_card_only=True)
    cards.exclude(whole).exclude(whole_card_only=False).update(whole_card_only=False)


def node_preflight_request(*, node: Node) -> Node:
    """Judge the node now (a discovery, in the background, after this transaction)."""
    if not node.host_key:
        raise Conflict("Approve the node's host key first.", code="pending_host_key")
    from . import tasks

    transaction.on_commit(lambda: tasks.discover_node.delay(node.pk))
    return node


def _policy_clean(field: str, value):  # type: ignore[no-untyped-def]
    """One policy setting as ops gave it, checked; raises ServiceError naming it."""
    from . import runtime

    try:
        if field in ("min_toolkit_version", "min_runc_version"):
            return preflight.check_version(str(value))
        if field == "driver_branches":
            if not isinstance(value, list):
                raise ValueError('a list of driver branches, e.g. ["550", "570"]')
            return sorted({preflight.check_branch(b) for b in value})
        if field == "known_fixed_builds":
            if not isinstance(value, list):
                raise ValueError("a list of {component, build, reason}")
            out = []
            for item in value:
                if not isinstance(item, dict) or set(item) - {"component", "build", "reason"}:
                    raise ValueError("each entry is {component, build, reason}")
                component = str(item.get("component", "")).strip()
                build = str(item.get("build", "")).strip()
                reason = str(item.get("reason", "")).strip()
                if component not in preflight.COMPONENTS:
                    raise ValueError(f"component is runc or toolkit, not {component!r}")
                if not build or len(build) > 100 or any(c.isspace() for c in build):
                    raise ValueError(f"build {build!r} must be a package version, no spaces")
                if not reason:
                    raise ValueError(f"the entry for {component} {build} needs a reason")
                out.append({"component": component, "build": build, "reason": reason[:300]})
            return out
        if field == "probe_image":
            return runtime._check_image(str(value).strip())
        if field == "probe_command":
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(v, str) and v and "\0" not in v for v in value)
            ):
                raise ValueError("the allocation command is a non-empty list of strings")
            return value
        if field == "probe_environment":
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ValueError("an object of NAME: value strings")
            for name in value:
                if isolation.reserved_reason(name) is not None:
                    raise ValueError(isolation.refusal(name))
            runtime.check_tenant_env(preflight.probe_environment(value, 1))
            return value
    except ValueError as exc:
        raise ServiceError(f"{field}: {exc}", field=field) from None
    raise ServiceError(f"{field} is not a node policy setting.", field=field)


@transaction.atomic
def node_policy_update(*, actor, reason: str, **changes) -> NodePolicy:  # type: ignore[no-untyped-def]
    """Change the node policy; each changed setting is recorded with who, when and why.
    Every node is judged again at its next discovery (a task re-runs them at once)."""
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError(
            "Say why the policy changes (it is kept with the change).", field="reason"
        )
    node_policy()
    row = NodePolicy.objects.select_for_update().get(pk=1)
    changed = []
    for field, value in changes.items():
        clean = _policy_clean(field, value)
        old = getattr(row, field)
        if old == clean:
            continue
        setattr(row, field, clean)
        changed.append(
            NodePolicyChange(
                changed_by=actor, field=field, old_value=old, new_value=clean, reason=reason[:500]
            )
        )
    if changed:
        row.save()
        NodePolicyChange.objects.bulk_create(changed)
        from . import tasks

        transaction.on_commit(tasks.preflight_all.delay)
    return row


@transaction.atomic
def node_accept_watchdog_only(*, node: Node, actor, accept: bool, reason: str) -> Node:  # type: ignore[no-untyped-def]
    """Ops accept (or withdraw) selling this node's non-MIG GPUs in slices without a
    proven quota library: the watchdog alone then holds each slice to its quota."""
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("Say why (it is kept in the policy's history).", field="reason")
    node = Node.objects.select_for_update().get(pk=node.pk)
    before = node.watchdog_only_accepted_at is not None
    if before == accept:
        return node
    node.watchdog_only_accepted_at = timezone.now() if accept else None
    node.watchdog_only_accepted_by = actor if accept else None
    node.watchdog_only_reason = reason[:500] if accept else ""
    node.save(
        update_fields=[
            "watchdog_only_accepted_at", "watchdog_only_accepted_by", "watchdog_only_reason"
        ]
    )  # fmt: skip
    NodePolicyChange.objects.create(
        changed_by=actor,
        node=node,
        field="watchdog_only",
        old_value=before,
        new_value=accept,
        reason=reason[:500],
    )
    _sell_whole(node, quota=(node.preflight or {}).get("quota") or {})
    return node
