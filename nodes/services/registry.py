"""The node inventory: registration and its validation, host keys, drain, and discovery
of a node's GPUs and capabilities (which ends in the preflight gate)."""

from __future__ import annotations

import ipaddress
import logging
import re
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict, Unpack

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict, ServiceError

from .. import ssh, telemetry
from ..locks import gpus_lock_by_uuid, node_lock
from ..models import AgentState, Gpu, Node
from .agent import node_agent_check
from .gate import node_preflight
from .policy import gpus_set_whole_card
from .rejudge import ADDRESS_CHANGED, HOST_KEY_CHANGED, REPINNED, node_gate_reset
from .sampling import node_record_failure, nodes_read

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from django.contrib.auth.models import User

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


def _clean_access(access: str) -> str:
    if access not in Node.Access.values:
        raise ServiceError(
            "Choose gateway (renters go through the platform's SSH gateway, nothing is "
            "published) or direct (ports published on the node's address).",
            code="invalid_choice",
            field="access",
        )
    return access


def _clean_registration(
    *, name: str, address: str, port: int, ssh_user: str, container_network: str
) -> dict[str, str | int]:
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
    access: str = Node.Access.GATEWAY,
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
    node = Node(**data, access=_clean_access(access), status=Node.Status.PENDING)
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
    if node.host_key:
        enqueue("telemetry.discover_node", node.pk)
    else:
        enqueue("telemetry.scan_host_key", node.pk)
    return node


class NodeChanges(TypedDict, total=False):
    """What `node_update` may change: where or how the node is reached."""

    name: str
    address: str
    port: int
    ssh_user: str
    container_network: str
    access: str
    host_key: str


@transaction.atomic
def node_update(*, node: Node, actor: User | None = None, **changes: Unpack[NodeChanges]) -> Node:
    """Change where or how a node is reached. A new address drops the pinned key; a new
    key (or address) puts the gate back to unchecked until a new preflight passes."""
    node = node_lock(node.pk)
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
    if "access" in changes:  # slices started from now on; running ones keep theirs
        node.access = _clean_access(changes["access"])
    repinned = False
    if "host_key" in changes and changes["host_key"].strip():
        key = _clean_host_key(changes["host_key"])
        repinned = key != node.host_key
        node.host_key = key
        node.host_key_fingerprint = ssh.fingerprint(node.host_key)
        node.pending_host_key = ""
    elif moved:
        # Another machine answers at the new address: its key must be approved again.
        node.host_key = node.host_key_fingerprint = ""
        node.status = Node.Status.PENDING
        node.status_reason = "address changed: approve the new host key"
    if repinned or moved:
        # another key (or address) is another machine until a preflight says otherwise;
        # a repinned one is judged at once, a moved one once its key is approved
        node_gate_reset(node=node, reason=REPINNED if repinned else ADDRESS_CHANGED, actor=actor)
    try:
        with transaction.atomic():
            node.save()
    except IntegrityError as exc:
        raise Conflict(
            "Another node has this name or address and port.", code="duplicate", field="name"
        ) from exc
    if moved and not node.host_key:
        enqueue("telemetry.scan_host_key", node.pk)
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
def node_approve_host_key(*, node: Node, fingerprint: str, actor: User | None = None) -> Node:
    """Pin the key read from the node. The fingerprint ops saw must match what is pinned,
    so a key that changed between display and approval is never trusted. A key that
    replaces a pinned one puts the gate back to unchecked until a new preflight passes."""
    node = node_lock(node.pk)
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
    changed = bool(node.host_key)  # a first key is a first contact, not a change
    node.host_key = node.pending_host_key
    node.host_key_fingerprint = expected
    node.pending_host_key = ""
    node.consecutive_failures = 0
    if changed:
        # a reinstall or an impostor: judged again (the discovery queued below runs the
        # preflight) before it takes slices on the old machine's verdict
        node_gate_reset(node=node, reason=HOST_KEY_CHANGED, actor=actor, queue=False)
    if node.status == Node.Status.UNREACHABLE:
        node.status = node.reachable_status
    node.status_reason = ""
    node.save()
    enqueue("telemetry.discover_node", node.pk)
    return node


@transaction.atomic
def node_rescan(*, node: Node) -> Node:
    enqueue("telemetry.scan_host_key", node.pk)
    return node


# --- drain --------------------------------------------------------------------------------


@transaction.atomic
def node_drain(*, node: Node, reason: str = "") -> Node:
    node = node_lock(node.pk)
    if node.drained_at is None:
        node.drained_at = timezone.now()
    node.drain_reason = reason.strip()[:500]
    if node.status == Node.Status.ACTIVE:
        node.status = Node.Status.DRAINING
    node.save(update_fields=["drained_at", "drain_reason", "status"])
    return node


@transaction.atomic
def node_undrain(*, node: Node) -> Node:
    node = node_lock(node.pk)
    node.drained_at = None
    node.drain_reason = ""
    if node.status == Node.Status.DRAINING:
        node.status = Node.Status.ACTIVE
    node.save(update_fields=["drained_at", "drain_reason", "status"])
    return node


# --- discovery ---------------------------------------------------------------------------

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
    [sample] = nodes_read(pool=pool, endpoints=[ssh.endpoint_for(node)], discover=True)
    if isinstance(sample, Exception):
        node_record_failure(node=node, exc=sample)
        raise sample
    now = timezone.now()
    with transaction.atomic():
        node = node_lock(node_id)
        if away := node.absence_reason(now):
            # judged by the preflight below before it is sold again (its verdict, not the
            # one from before the absence, opens it)
            node_gate_reset(node=node, reason=away, queue=False)
        _gpus_discovered(node, sample.gpus)
        caps = sample.capabilities or telemetry.Capabilities()
        _node_discovered(node, sample, caps, now)
    _agent_ensure(node, pool)
    # Outside the inventory's transaction: the probes take seconds.
    return node_preflight(node_id=node.pk, facts=caps.facts, pool=pool)


def _agent_ensure(node: Node, pool: ssh.SSHPool) -> None:
    """The node agent installed (or upgraded) and judged with every discovery; a failure
    here is the agent's state to show, never discovery's."""
    try:
        row = node_agent_check(node_id=node.pk, pool=pool, repair=True)
        if row.state != AgentState.OK:
            node_agent_check(node_id=node.pk, pool=pool, repair=False)
    except (ssh.SSHError, ValueError) as exc:
        logger.warning("node %s: the agent could not be checked: %s", node.name, exc)


def _gpus_discovered(node: Node, readings: tuple[telemetry.GpuReading, ...]) -> None:
    """The node's GPU rows as the node reads them now."""
    seen = {reading.uuid for reading in readings}
    # First flag what vanished, so a replacement GPU can take its index.
    Gpu.objects.filter(node=node, present=True).exclude(uuid__in=seen).update(
        present=False,
        accepting_placements=False,
        not_accepting_reason="no longer found on the node",
    )
    # By UUID across the fleet: a GPU moved from another node keeps its history.
    # Locked, and saved with only the fields discovery owns: placement keeps
    # allocated_mb (and ops the ratio and the placement mark) on these rows meanwhile.
    existing = gpus_lock_by_uuid(seen)
    for reading in readings:
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


def _node_discovered(
    node: Node, sample: telemetry.NodeSample, caps: telemetry.Capabilities, now: datetime
) -> None:
    """The node's own row: what it can enforce, its driver, and that it answered."""
    # Until this discovery's preflight has judged them, cards are sold in slices only
    # where the last verdict proved the quota for their model with the same library.
    last = node.preflight or {}
    same_library = last.get("quota_library", "") == (caps.vram_quota_library or "")
    gpus_set_whole_card(node=node, quota=(last.get("quota") or {}) if same_library else {})
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
